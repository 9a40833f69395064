"""A session's count of backward passes (backward_passes_per_step): how many each gradient has
left before it is handed over, whether the iteration's first gradient arrived and whether any
was handed over, and what no_sync() leaves in ``p.grad`` (Note [Accumulating without sending] in
csrc/gradient_intake.cpp)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from ... import _C

if TYPE_CHECKING:
    from ..iteration import IterationState
    from ..world_binding import WorldBinding

_NO_SYNC_AFTER_SEND = (
    "commsched: no_sync() was entered after a backward pass outside it sent gradients, before "
    "step(): those gradients are being averaged in place in p.grad, where the backward passes "
    "inside no_sync() would accumulate. Run the micro-batches inside no_sync() first and the "
    "last one outside it, as with DDP.")


class Accumulation:
    """Held by a Session. The dense gradients' passes are counted in C++ by the gradient intake
    (Note [Gradients handed over in C++], csrc/gradient_intake.h), the routed sparse ones' by
    the sparse route of the WorldBinding (SparseExchange.delay), which an elastic job makes
    again: it is read through the binding, and only while bound."""

    def __init__(self, passes: int, params: list[torch.Tensor],
                 routed: list[tuple[str, torch.Tensor]], binding: WorldBinding,
                 first_gradient: Callable[[], None], slow_path: Callable[[int], None],
                 state: IterationState) -> None:
        self.passes = passes
        # The gradient hooks are its objects (GradientHooks.install): it calls `first_gradient`
        # once per iteration and `slow_path` for what it leaves to Python.
        self.intake = _C.GradientIntake(len(params), passes, first_gradient, slow_path)
        self._state = state  # its held_back (Note [One iteration's state])
        self._params, self._routed, self._binding = params, routed, binding

    @property
    def started(self) -> bool:
        """Whether this iteration's first gradient arrived (Session.first_gradient ran)."""
        return self.intake.started

    @property
    def pending(self) -> bool:
        """Whether some gradient of this iteration was handed over and not yet reduced."""
        handed = self.intake.handed > 0
        if handed or not self._routed or not self._binding.bound:
            return handed  # no sparse gradient is routed, or none was counted (unbound)
        return self._binding.sparse.pending(self.passes)

    @contextlib.contextmanager
    def no_sync(self, passing_through: bool) -> Iterator[None]:
        """Backward passes inside leave their gradients in ``p.grad`` to accumulate and send
        nothing; the first backward outside hands over the sum. Nested blocks are one block;
        `passing_through` (no hook is registered) has nothing to hold back."""
        intake = self.intake
        if intake.held or passing_through:
            yield
            return
        if self.pending:
            raise RuntimeError(_NO_SYNC_AFTER_SEND)
        intake.held = True
        try:
            yield
        finally:
            intake.held = False
            self._state.held_back = any(p.grad is not None for p in self._params) or \
                any(p.grad is not None for _, p in self._routed)

    def received(self, tensor_id: int) -> bool:
        """Whether tensor `tensor_id` got a gradient in this iteration (a pass counted)."""
        return bool(self.intake.remaining(tensor_id) < self.passes)

    def set_passes(self, passes: int) -> None:
        """Every tensor expects `passes` gradients from now on; what was counted is forgotten."""
        self.passes = passes
        self.intake.reset(passes)
        if self._routed and self._binding.bound:
            self._binding.sparse.reset(passes)

    def start_over(self) -> None:
        """Counts as at the start of an iteration: every tensor expects `passes` gradients, and
        the next one is the iteration's first (Session.first_gradient runs). Gradients that
        no_sync() held back stay where they are."""
        self.intake.next_iteration(self.passes)
        if self._routed and self._binding.bound:
            self._binding.sparse.reset(self.passes)

    def end_iteration(self) -> None:
        """start_over() after the iteration's reduction, which took what no_sync() held back with
        it (handed over by the next backward pass, or at step())."""
        self._state.held_back = False
        # start_over's, without its call: this runs every iteration.
        self.intake.next_iteration(self.passes)
        if self._routed and self._binding.bound:
            self._binding.sparse.reset(self.passes)
