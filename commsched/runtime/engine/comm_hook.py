"""What the engine's reduction runs beside a plan's collectives: a comm hook with its own state,
registered on the engine handle, as DDP's comm hooks hold a PowerSGDState.

Note [Compression is a comm hook]
Lossy compression changes four moments of an iteration: a gradient's hand-over (it goes to the
compressor, which marks its wire tensors ready), the end of backward (gradients not produced
still count, as zeros), the wait at synchronize() or step() (PowerSGD's second round before it,
the gradients rebuilt after it), and the end of the iteration (compression starts at its
start_step, top-k moves through its warm-up stages). Each is one method of CommHook, whose
default does what an uncompressed run needs: nothing, the engine taking the gradient as it is.
The session, the gradient hooks, the step modes and the overlap runner call the engine's hook at
those moments and never ask whether compression runs; LossyHook (lossy_hook.py) holds the
compressor and its scale and answers them itself (compressing or not yet, by its start_step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ...plan import Plan
from ...plan.compressed import WireLayout


class RunningCompressor(Protocol):
    """What an overlap plan's layout reads of a compressor while it runs (overlap_layout.py)."""

    ids: list[int]  # the compressed tensors, by index

    @property
    def layout(self) -> WireLayout: ...


class CommHook:
    """The default hook: every gradient goes to the engine as it is."""

    # Tensor ids whose hand-over is Python's: the C++ gradient intake leaves them to the
    # slow path (runtime/intake/gradient_hooks.py), which offers them to `hand_over`.
    python_ids: tuple[int, ...] = ()
    # Whether the hook's work matters in a world of one too (error feedback changes the
    # gradients there): such a session never steps as the plain optimizer.
    works_alone = False

    def hand_over(self, tensor_id: int, grad: torch.Tensor) -> bool:
        """Offers the finished gradient of `tensor_id`; returns whether the hook took it (else
        the engine takes it as it is)."""
        return False

    def launch_rest(self) -> None:
        """At step(): the hook's gradients not produced on this rank, as zeros."""

    def before_wait(self, plan: Plan) -> None:
        """Before a synchronous wait for every block of `plan`."""

    def after_wait(self) -> None:
        """After that wait: the gradients in ``p.grad`` as the optimizer is to see them."""

    def deferred_round(self, plan: Plan, before_wait: Callable[[int], None]) -> None:
        """At an overlap plan's step(): what must be launched before step() returns;
        `before_wait(position)` runs before any wait for the block at `position`."""

    def iteration_ended(self, iteration: int) -> None:
        """After the iteration that `iteration` now counts."""

    def running(self) -> RunningCompressor | None:
        """The compressor whose gradients an overlap plan's groups rebuild, while it runs."""
        return None

    def decompress(self, index: int, out: torch.Tensor) -> None:
        """Rebuilds the hook's gradient `index` into `out` (an overlap plan's group update)."""
        raise AssertionError("commsched: an uncompressed run rebuilds no gradient")
