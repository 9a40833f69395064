"""The Python side of a session's gradient hooks: what the C++ gradient intake (Note [Gradients
handed over in C++], csrc/gradient_intake.h) calls back into, once per iteration and for the
gradients it does not take itself, and the hooks of the parameters the sparse route carries."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .. import _C
from .wrap import TOO_MANY_BACKWARDS, dense_layout

if TYPE_CHECKING:
    from .compressed import CompressedGradients
    from .overlap import OverlapRunner
    from .sparse import SparseExchange


class GradientHooks:
    """Mixed into Session, which provides the intake, the parameters, the compressor, the
    runner, the sparse route, the engine's mark_ready and `_first_gradient`."""

    intake: _C.GradientIntake | None
    params: list[torch.Tensor]
    compressed: CompressedGradients | None
    runner: OverlapRunner | None
    sparse: SparseExchange
    _densified: set[int]
    _mark_ready: Callable[[int, torch.Tensor], None]

    def _first_gradient(self) -> None:
        raise NotImplementedError

    def _first_gradient_call(self) -> Callable[[], None]:
        """What the gradient intake calls before an iteration's first gradient."""
        this = weakref.ref(self)  # see Note [a dropped optimizer releases its engine]

        def first_gradient() -> None:
            session = this()
            if session is not None:
                session._first_gradient()
        return first_gradient

    @property
    def _gradients_started(self) -> bool:
        """Whether this iteration's first gradient arrived (Session._first_gradient ran)."""
        return self.intake is not None and self.intake.started

    @_gradients_started.setter
    def _gradients_started(self, started: bool) -> None:
        if self.intake is not None:
            self.intake.started = started

    def _slow_path(self) -> Callable[[int], None]:
        """What the gradient intake hands to Python (Note [Gradients handed over in C++],
        csrc/gradient_intake.h): sparse and non-contiguous gradients, a compressor's tensors, a
        pass too many, and any gradient while no engine is bound. The common case, a dense
        gradient, is counted and handed to the engine in C++."""
        this = weakref.ref(self)  # see Note [a dropped optimizer releases its engine]

        def slow_path(tensor_id: int) -> None:
            session = this()
            if session is None:
                return
            intake = session.intake
            assert intake is not None
            if intake.remaining(tensor_id) <= 0:
                raise AssertionError(TOO_MANY_BACKWARDS)
            param = session.params[tensor_id]
            grad = param.grad
            if grad is None:
                return
            if grad.is_sparse:
                session._densify(tensor_id, param)
            if intake.take_pass(tensor_id) != 1:
                return
            compressed = session.compressed
            if compressed is not None and compressed.on and tensor_id in compressed.ids:
                compressed.hand_over(compressed.ids.index(tensor_id), dense_layout(param))
            else:
                session._mark_ready(tensor_id, dense_layout(param))
        return slow_path

    def _densify(self, tensor_id: int, param: torch.Tensor) -> None:
        """Note [sparse gradients without a route]
        A sparse gradient of a parameter the plan holds as dense (sparse_as_dense=True, or no model=
        to tell commsched before training which parameters are sparse) is reduced dense, as
        Horovod's sparse_as_dense does, and handed back sparse after the reduction (`_resparsify`),
        so that optimizers that take only sparse gradients (SparseAdam) still work. Every rank
        reduces the same dense block whatever it holds; rows no rank touched are left out of the
        sparse result. A wrapper with an overlap runner (the overlap policies and `auto`, given
        model=) keeps it dense: the runner applies deferred updates from the dense reduced
        gradients, and one optimizer state (SGD's momentum buffer) must not see both kinds."""
        assert param.grad is not None
        param.grad = param.grad.to_dense()
        if self.runner is None:
            self._densified.add(tensor_id)

    def _resparsify(self) -> None:
        for tensor_id in self._densified:
            param = self.params[tensor_id]
            if param.grad is not None and not param.grad.is_sparse:
                param.grad = param.grad.to_sparse(1)
        self._densified.clear()

    def _sparse_hook(self, index: int):
        this = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            session = this()
            if session is None or (session.intake is not None and session.intake.held):
                return  # no_sync(): Note [Accumulating without sending]
            # The gradient stays in p.grad until the exchange at synchronize()/step().
            if not session._gradients_started:
                session._first_gradient()
            delay = session.sparse.delay
            if delay[index] <= 0:
                raise AssertionError(TOO_MANY_BACKWARDS)
            if param.grad is not None:
                delay[index] -= 1
        return hook
