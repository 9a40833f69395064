"""A session's hooks on its parameters' gradients: registered, removed (a world of one passing
through) and registered again here only; and what the C++ gradient intake (Note [Gradients
handed over in C++], csrc/gradient_intake.h) calls back into, once per iteration and for the
gradients it does not take itself, and the hooks of the parameters the sparse route carries."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ... import _C
from ..wrap import TOO_MANY_BACKWARDS, dense_layout

if TYPE_CHECKING:
    from ..engine.handle import EngineHandle
    from ..iteration import IterationState
    from ..modes.overlap.runner import OverlapRunner
    from .accumulation import Accumulation
    from .sparse_route import SparseExchange


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
