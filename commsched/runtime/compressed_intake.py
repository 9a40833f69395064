"""A session's side of lossy compression (PowerSGD, top-k): the gradient hook that hands a
compressed tensor's gradient to the compressor, and switching compression on at its start_step
(the math and the factor buffers are in runtime/compressed.py; the wire tensors' place in the
plan in plan/compressed.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .compressed import CompressedGradients
from .lifecycle import PlanLifecycle
from .wrap import TOO_MANY_BACKWARDS, dense_layout


class CompressedIntake:
    """Mixed into Session, which provides the iteration counts and the plain gradient hook."""

    compressed: CompressedGradients | None
    lifecycle: PlanLifecycle
    iteration: int
    _delay: list[int]
    _handed: int
    _marked: int
    _gradients_started: bool

    def _gradient_hook(self, tensor_id: int) -> Callable[[torch.Tensor], None]:
        raise NotImplementedError

    def _first_gradient(self) -> None:
        raise NotImplementedError

    def _densify(self, tensor_id: int, param: torch.Tensor) -> None:
        raise NotImplementedError

    def _compressed_hook(self, tensor_id: int):
        """The gradient hook of a tensor that compression may carry: while compressing, the
        gradient goes to the compressor (which hands its wire tensors to the engine)."""
        plain = self._gradient_hook(tensor_id)
        compressed = self.compressed
        assert compressed is not None
        index = compressed.ids.index(tensor_id)
        this = weakref.ref(self)  # see Note [a dropped optimizer releases its engine]

        def hook(param: torch.Tensor) -> None:
            if not compressed.on:
                plain(param)
                return
            session = this()
            if session is None:
                return
            if not session._gradients_started:
                session._first_gradient()
            remaining = session._delay[tensor_id]
            if remaining <= 0:
                raise AssertionError(TOO_MANY_BACKWARDS)
            if param.grad is None:
                return
            if param.grad.is_sparse:
                session._densify(tensor_id, param)
            session._delay[tensor_id] = remaining - 1
            session._handed += 1
            if remaining == 1:
                session._marked += 1
                compressed.hand_over(index, dense_layout(param))
        return hook

    def _compression_switch(self) -> None:
        """Compression starts at its start_step: from then on the plans carry its wire tensors
        (commsched.plan.compressed); the plan in place is rebuilt when it starts mid-run."""
        compressed = self.compressed
        if compressed is None or compressed.on \
                or self.iteration < compressed.lossy.start_step:
            return
        compressed.on = True
        self.lifecycle.wire = compressed.layout
        if self.iteration > 0:
            self.lifecycle.reinstall(self.iteration)

    def compression_restored(self) -> None:
        """After load_state_dict(): compressing or not as the saved run was at this iteration
        (the restored plan already carries the wire tensors if it was)."""
        compressed = self.compressed
        if compressed is not None and self.iteration >= compressed.lossy.start_step:
            compressed.on = True
            self.lifecycle.wire = compressed.layout
