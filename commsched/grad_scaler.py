"""The wrapper's side of torch.amp.GradScaler: what step() does when the scaler calls it.

The flags of Horovod's synchronize()/step() protocol are optimizer.py's (StepProtocol); this is
the update itself, skipped on an overflow and unscaled otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .torch_compat import unscale_grads_

if TYPE_CHECKING:
    from .runtime.session import Session

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

UNSCALE_BEFORE_SYNCHRONIZE = (
    "commsched: scaler.unscale_(optimizer) read the gradients before they were averaged across "
    "ranks. Call optimizer.synchronize() before scaler.unscale_(optimizer), then "
    "scaler.step(optimizer) inside `with optimizer.skip_synchronize():` (Horovod's recipe), or "
    "call scaler.step(optimizer) without unscale_() (DDP's recipe).")

# What GradScaler sets on the optimizer for one step() call, and deletes after it.
_SCALER_ATTRIBUTES = ("grad_scale", "found_inf")


def scaled_step(optimizer: torch.optim.Optimizer, session: Session, native_amp_scaling: bool,
                closure: Any) -> Any:
    """The update of a step() that GradScaler called, with the gradients already averaged.

    Args:
        optimizer: the wrapper, carrying GradScaler's ``grad_scale`` (None once the user
            unscaled) and ``found_inf`` for this call.
        session: the wrapper's run, which times the update or records it as skipped.
        native_amp_scaling: whether the user's optimizer reads ``grad_scale`` and
            ``found_inf`` itself (fused Adam); other optimizers refuse a step that has them.
        closure: passed to the user's optimizer step.

    Returns:
        What the user's optimizer step returns; None when the step is skipped (an overflow,
        identical on every rank: inf and NaN survive the average).
    """
    attributes = vars(optimizer)
    if attributes["found_inf"].item():  # as DDP's GradScaler does: one sync per step
        session.mode.skip_update()
        return None
    hidden: dict[str, Any] = {}
    if not native_amp_scaling:
        grad_scale = attributes["grad_scale"]
        if grad_scale is not None:
            unscale_grads_([p for group in optimizer.param_groups for p in group["params"]],
                           grad_scale)
        hidden = {key: attributes.pop(key) for key in _SCALER_ATTRIBUTES}
    try:
        return session.mode.update(lambda: session.deferred.base_step(optimizer, closure),
                                   closure)
    finally:
        attributes.update(hidden)  # the scaler deletes them after this call returns
