"""The Python half of the C++ gradient intake (Note [Gradients handed over in C++],
csrc/gradient_intake.h), in two objects a Session holds: its Accumulation, which owns the intake
and counts the backward passes (backward_passes_per_step: how many each gradient has left before
it is handed over, whether the iteration's first gradient arrived and whether any was handed
over, and what no_sync() leaves in ``p.grad``: Note [Accumulating without sending] in
csrc/gradient_intake.cpp); and its GradientHooks, the hooks on its parameters' gradients
(registered, removed for a world of one passing through and registered again here only), with
what the intake calls back into, once per iteration and for the gradients it does not take
itself, and the hooks of the parameters the sparse route carries."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ... import _C
from ..wrap import TOO_MANY_BACKWARDS, dense_layout

if TYPE_CHECKING:
    from ..engine.handle import EngineHandle
    from ..iteration import IterationState
    from ..modes.overlap.runner import OverlapRunner
    from .sparse_route import SparseExchange

_NO_SYNC_AFTER_SEND = (
    "commsched: no_sync() was entered after a backward pass outside it sent gradients, before "
    "step(): those gradients are being averaged in place in p.grad, where the backward passes "
    "inside no_sync() would accumulate. Run the micro-batches inside no_sync() first and the "
    "last one outside it, as with DDP.")


class _SparseRouteHolder(Protocol):
    """What the passes' count reads of the session's WorldBinding (runtime/world_binding.py,
    which imports this module through the step modes)."""

    @property
    def bound(self) -> bool: ...
    @property
    def sparse(self) -> SparseExchange: ...


class Accumulation:
    """Held by a Session. The dense gradients' passes are counted in C++ by the gradient intake
    (Note [Gradients handed over in C++], csrc/gradient_intake.h), the routed sparse ones' by
    the sparse route of the WorldBinding (SparseExchange.delay), which an elastic job makes
    again: it is read through the binding, and only while bound."""

    def __init__(self, passes: int, params: list[torch.Tensor],
                 routed: list[tuple[str, torch.Tensor]], binding: _SparseRouteHolder,
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


class _Session(Protocol):
    """What the hooks read of the session that holds them (runtime/session.py, which imports
    this module)."""

    accumulation: Accumulation
    params: list[torch.Tensor]
    @property
    def overlap_runner(self) -> OverlapRunner | None: ...

    @property
    def engine(self) -> EngineHandle: ...
    @property
    def sparse(self) -> SparseExchange: ...
    def first_gradient(self) -> None: ...


class GradientHooks:
    """Held by a Session. Nothing here refers to the session but through a weak reference
    (Note [a dropped optimizer releases its engine] in release.py)."""

    def __init__(self, session: _Session, state: IterationState) -> None:
        self._session = weakref.ref(session)
        # Every hook handle, the dense parameters' first: the list the session's Resources
        # removes at release, so it is changed in place, never replaced.
        self.handles: list[Any] = []
        self.dense_count = 0  # dense gradients that reach the engine from a hook
        self._state = state  # its densified tensors (Note [One iteration's state])

    # -- registration ---------------------------------------------------------------------------

    def install(self, intake: _C.GradientIntake, params: list[torch.Tensor],
                routed: list[tuple[str, torch.Tensor]]) -> None:
        """The dense parameters' hooks, which hand each gradient to the intake, then the sparse
        route's, which count the passes."""
        self.handles += self._dense_hooks(intake, params)
        self.dense_count = len(self.handles)
        self.handles += [p.register_post_accumulate_grad_hook(self._sparse_hook(i))
                         for i, (_, p) in enumerate(routed)]

    def remove_dense(self, params: list[torch.Tensor]) -> None:
        """Removes the dense parameters' hooks (a world of one passing through)."""
        for handle in self.handles[:self.dense_count]:
            handle.remove()
        # Note [An empty hook dict still costs a call] (csrc/gradient_intake.cpp): where no
        # other hook is left (the user's own stay), torch's hook object goes too.
        emptied = [p for p in params if p._post_accumulate_grad_hooks is not None
                   and not p._post_accumulate_grad_hooks]
        for param in emptied:
            param._post_accumulate_grad_hooks = None  # type: ignore[assignment]
        _C.drop_post_accumulate_grad_hooks(emptied)

    def restore_dense(self, intake: _C.GradientIntake, params: list[torch.Tensor]) -> None:
        """Registers the dense parameters' hooks again, in the places they had."""
        self.handles[:self.dense_count] = self._dense_hooks(intake, params)

    @staticmethod
    def _dense_hooks(intake: _C.GradientIntake, params: list[torch.Tensor]) -> list[Any]:
        return [p.register_post_accumulate_grad_hook(intake.hook(tid))
                for tid, p in enumerate(params) if p.numel() > 0]

    def all_handed_over(self, intake: _C.GradientIntake | None) -> bool:
        """Whether every hooked gradient is with the engine (zero-size ones are in no block)."""
        return intake is not None and intake.marked == self.dense_count

    # -- what the intake calls ------------------------------------------------------------------

    def first_gradient_call(self) -> Callable[[], None]:
        """What the gradient intake calls before an iteration's first gradient."""
        this = self._session

        def first_gradient() -> None:
            session = this()
            if session is not None:
                session.first_gradient()
        return first_gradient

    def slow_path(self) -> Callable[[int], None]:
        """What the gradient intake hands to Python (Note [Gradients handed over in C++],
        csrc/gradient_intake.h): sparse and non-contiguous gradients, a compressor's tensors, a
        pass too many, and any gradient while no engine is bound. The common case, a dense
        gradient, is counted and handed to the engine in C++."""
        this = self._session

        def slow_path(tensor_id: int) -> None:
            session = this()
            if session is None:
                return
            intake = session.accumulation.intake
            if intake.remaining(tensor_id) <= 0:
                raise AssertionError(TOO_MANY_BACKWARDS)
            param = session.params[tensor_id]
            grad = param.grad
            if grad is None:
                return
            if grad.is_sparse:
                self.densify(tensor_id, param, session.overlap_runner is None)
            if intake.take_pass(tensor_id) != 1:
                return
            engine = session.engine
            if not engine.comm_hook.hand_over(tensor_id, dense_layout(param)):
                engine.mark_ready(tensor_id, dense_layout(param))
        return slow_path

    def _sparse_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        this = self._session

        def hook(param: torch.Tensor) -> None:
            session = this()
            if session is None or session.accumulation.intake.held:
                return  # no_sync(): Note [Accumulating without sending]
            # The gradient stays in p.grad until the exchange at synchronize()/step().
            if not session.accumulation.started:
                session.first_gradient()
            delay = session.sparse.delay
            if delay[index] <= 0:
                raise AssertionError(TOO_MANY_BACKWARDS)
            if param.grad is not None:
                delay[index] -= 1
        return hook

    # -- gradients the hooks did not hand over --------------------------------------------------

    def launch_rest(self, intake: _C.GradientIntake | None, params: list[torch.Tensor],
                    engine: EngineHandle,
                    lacked: Callable[[], None], handing_back_sparse: bool) -> None:
        """Marks every gradient not produced on this rank as ready, as zeros (Horovod's rule:
        another rank may have computed it); `lacked` hears of each."""
        if self.all_handed_over(intake):
            return  # every hooked gradient is with the engine (zero-size ones are in no block)
        for tensor_id in engine.not_ready():
            if tensor_id >= len(params):
                continue  # a compressor's wire tensor: released by the compressor
            param = params[tensor_id]
            if param.grad is None:
                lacked()
                param.grad = torch.zeros_like(param)
            elif param.grad.is_sparse:
                self.densify(tensor_id, param, handing_back_sparse)
            engine.mark_ready(tensor_id, dense_layout(param))

    def densify(self, tensor_id: int, param: torch.Tensor, hand_back_sparse: bool) -> None:
        """Note [sparse gradients without a route]
        A sparse gradient of a parameter the plan holds as dense (sparse_as_dense=True, or no
        model= to tell commsched before training which parameters are sparse) is reduced dense,
        as Horovod's sparse_as_dense does, and handed back sparse after the reduction
        (`resparsify`), so that optimizers that take only sparse gradients (SparseAdam) still
        work. Every rank reduces the same dense block whatever it holds; rows no rank touched
        are left out of the sparse result. A wrapper with an overlap runner (the overlap
        policies and `auto`, given model=) keeps it dense (`hand_back_sparse` false): the
        runner applies deferred updates from the dense reduced gradients, and one optimizer
        state (SGD's momentum buffer) must not see both kinds."""
        assert param.grad is not None
        param.grad = param.grad.to_dense()
        if hand_back_sparse:
            self._state.densified.add(tensor_id)

    def resparsify(self, params: list[torch.Tensor]) -> None:
        for tensor_id in self._state.densified:
            param = params[tensor_id]
            if param.grad is not None and not param.grad.is_sparse:
                param.grad = param.grad.to_sparse(1)
        self._state.densified.clear()
