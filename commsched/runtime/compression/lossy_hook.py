"""The comm hook of a lossy compressor: PowerSGD or top-k with error feedback (compressed.py),
registered on the engine handle by the binding (Note [Compression is a comm hook] in
engine/handle.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ... import _C
from ...plan import Plan
from ..engine.handle import CommHook
from .gradients import CompressedGradients

if TYPE_CHECKING:
    from ..engine.handle import EngineHandle
    from ..planning.lifecycle import PlanLifecycle


class LossyHook(CommHook):
    """PowerSGD or top-k with error feedback (runtime/compression/gradients.py), from its
    start_step."""

    works_alone = True

    def __init__(self, state: CompressedGradients, scale: float, engine: EngineHandle,
                 lifecycle: PlanLifecycle) -> None:
        self.state = state
        self.python_ids = tuple(state.ids)
        self._index = {tensor_id: index for index, tensor_id in enumerate(state.ids)}
        self._scale = scale  # the engine's pre- x post-scale, which top-k applies itself
        self._engine = engine
        self._lifecycle = lifecycle  # which rebuilds the plan when compression starts

    def hand_over(self, tensor_id: int, grad: torch.Tensor) -> bool:
        index = self._index.get(tensor_id)
        if index is None or not self.state.on:
            return False
        self.state.hand_over(index, grad)
        return True

    def launch_rest(self) -> None:
        if self.state.on:
            self.state.launch_rest()

    def _second_round(self, plan: Plan, before_wait: Callable[[int], None] | None) -> None:
        """PowerSGD's Qs, on the timeline as one span."""
        started = _C.now_us()
        self.state.release_late(plan, before_wait)
        self._engine.span("compress", started, what="orthogonalise P, Q = M^T P")

    def before_wait(self, plan: Plan) -> None:
        if self.state.on:
            self._second_round(plan, None)

    def after_wait(self) -> None:
        if not self.state.on:
            return
        started = _C.now_us()
        self.state.finish(self._scale)
        self._engine.span("decompress", started)
        self._engine.profiler.note("compression_s", self.state.take_busy_s())

    def deferred_round(self, plan: Plan, before_wait: Callable[[int], None]) -> None:
        # Note [Compression under an overlap plan] in compression/gradients.py
        if not self.state.on:
            return
        self._second_round(plan, before_wait)
        self.state.end_round()
        self._engine.profiler.note("compression_s", self.state.take_busy_s())

    def iteration_ended(self, iteration: int) -> None:
        self.state.switch_on_at(iteration, self._lifecycle)

    def running(self) -> CompressedGradients | None:
        return self.state if self.state.on else None

    def decompress(self, index: int, out: torch.Tensor) -> None:
        self.state.decompress(index, out, self._scale)
