"""Horovod's synchronize()/step() protocol: which step() reduces, and when the wrapper warns.

The wrapper (optimizer.py) holds one StepProtocol as ``_cs_protocol``: the flags that say whether
the gradients were already synchronized, by whom (the user or GradScaler's question), and whether
step() runs inside skip_synchronize(); and Horovod's rule that zero_grad() must not clear
gradients still being reduced. The update of a step GradScaler calls is grad_scaler.py's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .grad_scaler import UNSCALE_BEFORE_SYNCHRONIZE, scaled_step

if TYPE_CHECKING:
    from .runtime.session import Session

_STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
_ZERO_GRAD_DROPS_ACCUMULATION = (
    "commsched: zero_grad() drops gradients accumulated under no_sync() that were never "
    "averaged or applied (the last backward pass ran inside no_sync(), as at the end of an epoch "
    "whose micro-batches do not fill a whole step). To keep them, call optimizer.step() before "
    "zero_grad(): it averages what was accumulated and steps.")
_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class StepProtocol:
    """The flags of Horovod's synchronize()/step() protocol, and what step() does with them."""

    def __init__(self, native_amp_scaling: bool) -> None:
        """Starts outside skip_synchronize(), with nothing synchronized.

        Args:
            native_amp_scaling: whether the user's optimizer reads GradScaler's ``grad_scale``
                and ``found_inf`` itself (fused Adam).
        """
        self.should_synchronize = True  # False inside skip_synchronize()
        self.synchronized = False  # synchronize() ran since the last step()
        # Note [GradScaler asks before it unscales]: whether the last synchronize() was the
        # scaler's, and whether the user's optimizer unscales by itself (fused Adam).
        self.synchronized_for_scaler = False
        self.native_amp_scaling = native_amp_scaling

    @property
    def reduces(self) -> bool:
        """Whether step() is to reduce the gradients itself (no synchronize() was called)."""
        return self.should_synchronize and not self.synchronized

    def after_synchronize(self) -> None:
        """Records an explicit synchronize(): the next step() steps on its gradients."""
        self.synchronized = True
        self.synchronized_for_scaler = False

    def before_scaler(self, synchronize: Callable[[], None]) -> None:
        """GradScaler asks before it reads a gradient: reduce them first, for the scaler."""
        if self.reduces:
            synchronize()
            self.synchronized_for_scaler = True

    @contextlib.contextmanager
    def skipping(self) -> Iterator[None]:
        """The block of skip_synchronize(): step() uses the gradients as they are."""
        self.should_synchronize = False
        try:
            yield
        finally:
            self.should_synchronize = True

    def before_update(self, synchronize: Callable[[], None]) -> None:
        """What a synchronous step() does before the update: reduce, unless skipped.

        Horovod's warning where synchronize() already reduced outside skip_synchronize().
        """
        if self.should_synchronize:
            if self.synchronized:
                warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=3)  # step()'s caller
            synchronize()
        self.synchronized = False

    def before_zero_grad(self, session: Session) -> None:
        """Horovod's rule for zero_grad(): not while gradients are being reduced in place.

        It also warns where zero_grad() drops gradients accumulated under no_sync() and never
        averaged.
        """
        accumulation = session.accumulation
        if accumulation.pending:  # never while passing through: no hook hands a gradient over
            raise AssertionError(_ZERO_GRAD_PENDING)
        if session.state.held_back:
            session.state.held_back = False
            warnings.warn(_ZERO_GRAD_DROPS_ACCUMULATION, stacklevel=3)  # zero_grad()'s caller

    def scaled_step(self, optimizer: torch.optim.Optimizer, session: Session,
                    closure: Any) -> Any:
        """step() called by GradScaler (Note [GradScaler asks before it unscales])."""
        if vars(optimizer)["grad_scale"] is None and self.synchronized_for_scaler:
            self.synchronized = False
            raise RuntimeError(UNSCALE_BEFORE_SYNCHRONIZE)
        if self.should_synchronize and self.synchronized and not self.synchronized_for_scaler:
            warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=3)  # the scaler, step()'s caller
        self.synchronized = False
        return scaled_step(optimizer, session, self.native_amp_scaling, closure)
