"""commsched.DistributedOptimizer: Horovod's signature and semantics, commsched's engine.

Like Horovod, the wrapper is an instance of a class made on the fly that derives from the
user's optimizer class, so ``isinstance`` checks, LR schedulers and ``state_dict()`` keep working.
This module is Horovod's surface only; the run itself (hooks, engine, plan, overlap) is the
wrapper's ``session`` (commsched.runtime.session).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from . import _C
from .compression import from_config, resolve, split
from .config import load_config
from .ops import Average, ReduceOp, resolve_op
from .params import resolve_groups, resolve_names
from .plan import Plan
from .runtime import checkpoint
from .runtime.auto import AutoState
from .runtime.deferred import adopt_plain_attributes
from .runtime.session import Session
from .runtime.wrap import WrapOptions
from .torch_compat import unscale_grads_

_STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider using "
    "optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.")
_UNSCALE_BEFORE_SYNCHRONIZE = (
    "commsched: scaler.unscale_(optimizer) read the gradients before they were averaged across "
    "ranks. Call optimizer.synchronize() before scaler.unscale_(optimizer), then "
    "scaler.step(optimizer) inside `with optimizer.skip_synchronize():` (Horovod's recipe), or "
    "call scaler.step(optimizer) without unscale_() (DDP's recipe).")
_ZERO_GRAD_DROPS_ACCUMULATION = (
    "commsched: zero_grad() drops gradients accumulated under no_sync() that were never "
    "averaged or applied (the last backward pass ran inside no_sync(), as at the end of an epoch "
    "whose micro-batches do not fill a whole step). To keep them, call optimizer.step() before "
    "zero_grad(): it averages what was accumulated and steps.")
_ZERO_GRAD_PENDING = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in front of the user's optimizer class. Its own attributes: ``session`` (the run)
    and two flags of Horovod's synchronize()/step() protocol."""

    session: Session

    def _cs_setup(self, session: Session, native_amp_scaling: bool) -> None:
        self.session = session
        self._cs_should_synchronize = True
        self._cs_synchronized = False
        # Note [GradScaler asks before it unscales]: whether the last synchronize() was the
        # scaler's, and whether the user's optimizer unscales by itself (fused Adam).
        self._cs_synchronized_for_scaler = False
        self._cs_native_amp_scaling = native_amp_scaling
        # Note [zero_grad after a deferred step]
        self._cs_torch_zero_grad = session.base_cls.zero_grad is torch.optim.Optimizer.zero_grad

    @property
    def plan(self) -> Plan:
        """The plan the engine runs now."""
        return self.session.plan

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:
        """Horovod's private {parameter: name} map, which Horovod's own tests read (with no
        named_parameters, generated names, unique and equal on every rank)."""
        return dict(self.session.names)

    @property
    def auto(self) -> AutoState | None:
        """What policy 'auto' chose and how its prediction held up (None for other policies)."""
        return self.session.lifecycle.auto

    @property
    def backward_passes_per_step(self) -> int:
        return self.session.passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self.set_backward_passes_per_step(passes)

    def synchronize(self) -> None:
        """Reduces every gradient into ``p.grad``; missing ones count as zeros, as in Horovod."""
        self.session.synchronize()
        self._cs_synchronized = True
        self._cs_synchronized_for_scaler = False

    # Note [GradScaler asks before it unscales]
    # torch.amp.GradScaler.step(opt) first asks `opt._step_supports_amp_scaling`, before it
    # reads any gradient. Answering True makes the scaler check for inf/NaN itself and then
    # call step() with `grad_scale` and `found_inf` set on the optimizer, even when it found
    # an overflow; answering False would make it unscale and check the gradients itself, and
    # not call step() at all after an overflow. So the question is where the wrapper makes the
    # gradients final: it reduces them (synchronize()) before answering, and the scaler's check
    # then reads the averaged gradients, identical on every rank, as it does under DDP. An
    # overflow on one rank is an overflow on all (inf and NaN survive the average), every rank
    # skips the same step, and step() ends the iteration either way, so nothing is left
    # pending. Under an overlap plan the update is then made at step(): whether to skip it
    # needs every gradient. Horovod's recipe (synchronize(), scaler.unscale_(opt), then
    # scaler.step(opt) inside skip_synchronize()) reaches step() the same way. What cannot be
    # honoured is scaler.unscale_(opt) before the gradients are reduced: the scaler would read
    # (and rescale in place) gradients the engine is still reducing; step() raises then.
    @property
    def _step_supports_amp_scaling(self) -> bool:
        if self._cs_should_synchronize and not self._cs_synchronized:
            self.synchronize()
            self._cs_synchronized_for_scaler = True
        return True

    def _cs_scaled_step(self, closure: Any) -> Any:
        """step() called by GradScaler (Note [GradScaler asks before it unscales])."""
        session = self.session
        attributes = vars(self)  # GradScaler's, for this call only
        grad_scale: torch.Tensor | None = attributes["grad_scale"]
        found_inf: torch.Tensor = attributes["found_inf"]
        if grad_scale is None and self._cs_synchronized_for_scaler:
            self._cs_synchronized = False
            raise RuntimeError(_UNSCALE_BEFORE_SYNCHRONIZE)
        if self._cs_should_synchronize and self._cs_synchronized \
                and not self._cs_synchronized_for_scaler:
            warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=3)
        self._cs_synchronized = False
        if found_inf.item():  # as DDP's GradScaler does: every rank reads the same flag
            session.skip_update()
            return None
        if self._cs_native_amp_scaling:  # the fused step reads grad_scale and found_inf
            return session.update(lambda: session.deferred.base_step(self, closure), closure)
        if grad_scale is not None:
            unscale_grads_([p for group in self.param_groups for p in group["params"]],
                           grad_scale)
        # torch's other optimizers refuse a step that has them set; the scaler deletes them
        # after this call returns.
        del attributes["grad_scale"], attributes["found_inf"]
        try:
            return session.update(lambda: session.deferred.base_step(self, closure), closure)
        finally:
            attributes.update(grad_scale=grad_scale, found_inf=found_inf)

    def flush(self) -> None:
        """Applies every update still pending from cross-iteration overlap; a training loop
        calls it where it stops for a while (evaluation, checkpoint), and the profile leaves
        that stop out of the next iteration's compute."""
        self.session.flush(pause=True)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._cs_should_synchronize = False
        try:
            yield
        finally:
            self._cs_should_synchronize = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation, as DDP's ``no_sync()``: backward passes inside the block
        accumulate their gradients locally in ``p.grad`` and send nothing; the next backward
        outside it hands over the sum, which is averaged as usual.

        Yields:
            Nothing; the block runs the micro-batches whose gradients accumulate.

        Raises:
            RuntimeError: a backward pass outside the block already sent gradients of this
                iteration (step() has not been called since).
        """
        with self.session.no_sync():
            yield

    def step(self, closure: Any = None) -> Any:
        if "found_inf" in vars(self):  # GradScaler set it for this call
            return self._cs_scaled_step(closure)
        session = self.session
        if session.passthrough and self._cs_should_synchronize and not self._cs_synchronized:
            # Note [A world of one steps as the plain optimizer]: what synchronize() and
            # update() would do there, without their calls.
            session.iteration += 1
            return session.deferred.base_step(self, closure)
        if session.elastic and session.elastic_state_step:  # hvd.elastic's state sync
            return super().step(closure)
        if self._cs_should_synchronize and session.defers_updates and not self._cs_synchronized:
            if closure is not None:
                raise ValueError(f"commsched: policy '{session.config.policy.value}' defers the "
                                 "update to the next forward pass and cannot run a closure")
            session.step_deferred()
            return None
        if self._cs_should_synchronize:
            if self._cs_synchronized:
                warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=2)
            self.synchronize()
        self._cs_synchronized = False
        return session.update(lambda: session.deferred.base_step(self, closure), closure)

    def _cs_local_step(self) -> Any:
        """The user optimizer's own step, with no reduction (see Note [local step] in
        commsched.world.broadcast): only the calling rank runs it."""
        return super().step()

    def state_dict(self) -> dict[str, Any]:
        """torch's state plus a ``commsched`` entry (plan, iteration, pending profiling), which
        a plain torch optimizer ignores when it loads this."""
        # Not a pause: some loops save every step (Note [A pause is not compute]).
        self.session.flush()
        state = super().state_dict()
        entry = checkpoint.capture(self.session)
        if entry is not None:
            state[checkpoint.KEY] = entry
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also restores the saved plan and position when ``state_dict`` has a ``commsched``
        entry (call it on every rank, or on one rank followed by broadcast_optimizer_state)."""
        self.session.flush()  # not a pause, as in state_dict()
        self.session.hook_gradients()  # the restored plan may be another, or not yet settled
        entry = state_dict.get(checkpoint.KEY)
        if entry is not None:
            checkpoint.validate(self.session, entry)  # before torch's state changes
        super().load_state_dict({k: v for k, v in state_dict.items() if k != checkpoint.KEY})
        self.session.deferred.invalidate()  # torch replaced the state and param-group dicts
        if entry is not None:
            checkpoint.restore(self.session, entry)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.session.pending:  # never while passing through: no hook hands a gradient over
            raise AssertionError(_ZERO_GRAD_PENDING)
        if self.session.held_back:
            self.session.held_back = False
            warnings.warn(_ZERO_GRAD_DROPS_ACCUMULATION, stacklevel=2)
        # Note [zero_grad after a deferred step]
        # Under an overlap plan, step() took every gradient out of p.grad (the runner holds
        # them until their update in the next forward pass), so the zero_grad() of a training
        # loop finds nothing to clear; torch's own still costs a profiler range and a loop over
        # the parameters (about 20 us of the built-in MLP's 0.72 ms iteration on this project's
        # CPU). It is left out whenever it could change nothing: no parameter has a gradient
        # (one C++ pass over the param groups, which stops at the first gradient it finds) and
        # the optimizer class keeps torch's zero_grad.
        if self._cs_torch_zero_grad and _C.no_grads(self.param_groups):
            return
        super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes <= 0:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes}")
        self.session.set_passes(passes)


def DistributedOptimizer(  # Horovod's name: called like a class
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: Any = None,
        backward_passes_per_step: int = 1,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        sparse_as_dense: bool = False,
        process_set: Any = None,
        model: torch.nn.Module | None = None,
        policy: str | None = None,
        **knobs: Any) -> _DistributedOptimizer:
    """Wraps `optimizer` so that gradients are averaged across ranks by commsched's engine.

    `process_set` (Horovod's, since 0.23): an ``hvd.ProcessSet`` or a list of global ranks;
    gradients are averaged within it only, and a rank outside it steps on its own gradients.
    Keyword arguments beyond Horovod's override any knob (see commsched.config.KNOBS).
    ``compression`` defaults to what COMMSCHED_COMPRESSION names (``none`` unless set).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)!r}")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be > 0, got {backward_passes_per_step!r}")
    reduce_op = resolve_op(op)
    if gradient_predivide_factor != 1.0 and reduce_op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    config = load_config({**knobs, "policy": policy})
    named = resolve_names(optimizer, named_parameters)
    group_of = resolve_groups([p for _, p in named if p.requires_grad], num_groups, groups)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped: _DistributedOptimizer = object.__new__(cls)
    torch.optim.Optimizer.__init__(wrapped, optimizer.param_groups, optimizer.defaults)
    wrapped.state = optimizer.state
    adopt_plain_attributes(wrapped, optimizer)
    cast, lossy = split(from_config(config) if compression is None else resolve(compression))
    options = WrapOptions(cast, backward_passes_per_step, reduce_op,
                          float(gradient_predivide_factor), group_of, sparse_as_dense, model,
                          lossy=lossy, process_set=process_set)
    native_amp_scaling = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    wrapped._cs_setup(Session(wrapped, optimizer.__class__, named, options, config),
                      native_amp_scaling)
    return wrapped
