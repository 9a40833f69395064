"""Top-k under the user's momentum: Deep Gradient Compression's momentum correction and
momentum-factor masking (Lin et al., ICLR 2018), and the warning where no correction applies.

Note [DGC under the user's momentum]
Error feedback (M = g + e, send top-k of M, keep the rest in e) handed to a momentum optimizer
is unstable: a kept entry comes out late and in bursts, and momentum 0.9 then multiplies every
burst tenfold over the next steps. On a least-squares task (2 ranks, SGD momentum 0.9, lr 0.05,
top-k 10%, 300 steps) it ends at loss 0.59 against 0.042 uncompressed (tests/runtime/
compression/test_dgc_dist.py). DGC instead applies momentum *before* sparsifying, on each rank:

    u = m u + g               (this rank's velocity; Nesterov: u = m (u + g), v += u + g)
    v = v + u                 (what this rank has yet to send)
    send top-k of v; where sent, v = 0 and u = 0 (momentum-factor masking)
    update = lr x (the sum of every rank's sent entries, scaled as the all-reduce)

The exchanged sum is already the update: momentum must not be applied again. The user keeps
``SGD(momentum=0.9)`` and its step, which we do not touch (it runs under every policy, per
update group, under GradScaler); instead the gradient handed to it is chosen so that its own
momentum reproduces DGC's update: its momentum buffer is zeroed, then the buffer after SGD's
step is (1 - dampening) x (gradient + weight_decay x p), and the update that, plus Nesterov's
m x buffer; so the gradient is X / f - weight_decay x p, f from sgd_momentum_factor (1 for
plain momentum, 1 + m for Nesterov, the undamped first step included). The optimizer's update
then is exactly lr x X. Momentum is applied once: DGC's, on each rank before the exchange.

Weight decay belongs to the gradient (SGD puts it inside its momentum, and so does DGC): each
rank adds weight_decay x p to g before the correction, divided by the world where the op is Sum,
so that the exchanged sum holds it once, as the uncompressed update does. A consequence of
masking: an entry sent at every step (density 1) loses its velocity each time and moves as plain
SGD, which is DGC as published (tests/runtime/compression/test_dgc.py checks both this and the
reference).

Applies to torch.optim.SGD (its own step: a subclass that overrides it may compute anything)
with momentum > 0, not maximize, dampening < 1 (or Nesterov): the hyper-parameters are read per
param group when the gradient is handed over, so a group with momentum 0 keeps plain error
feedback, which is DGC with m = 0. Elsewhere (Adam's beta1, RMSprop's momentum) top-k keeps
plain error feedback and warns once: Adam divides by a second moment estimated from the
gradients it is handed, and bursts of accumulated velocity are not gradients, so no handed
gradient reproduces DGC's update there. PowerSGD does not warn: its error feedback under
momentum SGD is the published method (Vogels et al. trained with momentum 0.9, as does torch's
PowerSGD hook), and every entry moves at every step, so no entry is released late.

With a warm-up (``start_step``), SGD's own momentum runs while the gradients go uncompressed,
and DGC's velocities then start from its buffers rather than from zero, or the first compressed
steps would move by the gradient alone, a momentum-free stall at each switch. Each rank's u
takes SGD's buffer (the same on every rank), so the first compressed step's momentum term is
m x buffer, SGD's own; with Nesterov u = m x buffer, since DGC's v gets m u + (1 + m) g there
against SGD's g + m (m buffer + g). An entry sent at that step thus moves exactly as it would
have uncompressed (tests/runtime/compression/test_dgc.py).

What the user sees: ``p.grad`` after synchronize() is that handed gradient, not the averaged
one (clip_grad_norm_ there clips DGC's update divided by f). Under an fp16 GradScaler, the
weight-decay term (unscaled) rides with scaled gradients: its share is divided by the scale
and SGD's own weight decay stands in, as plain decay not carried by momentum. A step that the
scaler skips (an overflow, which the exchange spreads to every rank) leaves SGD's buffer as it
was; the velocities drop their non-finite entries.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...compression import LossyCompression, TopK
from ...compression_math import dgc_accumulate_, dgc_mask_, sgd_momentum_factor

NO_CORRECTION = (
    "commsched: Compression.topk() under {what}: top-k keeps plain error feedback, whose kept "
    "entries come out late and in bursts that momentum amplifies; training may converge slower "
    "or diverge. Deep Gradient Compression's momentum correction, which fixes it, applies to "
    "torch.optim.SGD (momentum > 0, not maximize, dampening < 1): use that, or "
    "Compression.powersgd() (docs/compression.md, 'Top-k under momentum').")


@dataclass(frozen=True)
class Hyper:
    """A param group's SGD hyper-parameters at hand-over time (they make the correction)."""

    momentum: float
    dampening: float
    nesterov: bool
    weight_decay: float


def steps_as_sgd(base_cls: type[torch.optim.Optimizer]) -> bool:
    """Whether `base_cls` updates with torch's SGD rule (its own step, not an override)."""
    return issubclass(base_cls, torch.optim.SGD) and base_cls.step is torch.optim.SGD.step


def correctable(group: dict[str, Any]) -> bool:
    """Whether an SGD param group's momentum can be reproduced by a handed gradient."""
    return not group.get("maximize", False) and (
        bool(group.get("nesterov", False)) or float(group.get("dampening", 0.0)) < 1.0)


def uncorrected_momentum(optimizer: torch.optim.Optimizer, base_cls: type,
                         params: Sequence[torch.Tensor]) -> str | None:
    """What momentum the correction cannot handle for `params` (for the warning), or None."""
    wanted = {id(p) for p in params}
    groups = [g for g in optimizer.param_groups if any(id(p) in wanted for p in g["params"])]
    sgd = steps_as_sgd(base_cls)
    for group in groups:
        momentum = float(group.get("momentum", 0.0) or 0.0)
        betas = group.get("betas")
        if sgd and momentum > 0 and not correctable(group):
            return "SGD with maximize=True or dampening=1"
        if not sgd and momentum > 0:
            return f"{base_cls.__name__} with momentum={momentum:g}"
        if not sgd and betas is not None and float(betas[0]) > 0:
            return f"{base_cls.__name__} with betas[0]={float(betas[0]):g}"
    return None


class MomentumCorrection:
    """DGC's velocities for the top-k tensors of one wrapped SGD (Note [DGC under the user's
    momentum]): accumulate at hand-over, mask where sent, hand the optimizer its gradient."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 shapes: Sequence[tuple[int, ...]], decay_share: float) -> None:
        self._optimizer = weakref.ref(optimizer)  # it holds the session, which holds this
        self.params = list(params)
        self.velocities = [torch.zeros(s, dtype=p.dtype, device=p.device)
                           for p, s in zip(params, shapes, strict=True)]
        self._decay_share = decay_share  # of weight_decay x p, added on each rank
        self._used: list[Hyper | None] = [None] * len(self.params)
        # Per tensor: whether its velocity is to start from SGD's buffer at its next hand-over
        # (compression has just started after a warm-up).
        self._continuing = [False] * len(self.params)
        self._groups_seen: list[dict[str, Any]] | None = None
        self._group_of: dict[int, dict[str, Any]] = {}

    def _group(self, index: int) -> dict[str, Any] | None:
        optimizer = self._optimizer()
        if optimizer is None:
            return None
        if optimizer.param_groups is not self._groups_seen:  # new after load_state_dict()
            self._groups_seen = optimizer.param_groups
            self._group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        return self._group_of.get(id(self.params[index]))

    def _hyper(self, index: int) -> Hyper | None:
        group = self._group(index)
        if group is None or not float(group.get("momentum", 0.0)) > 0 or not correctable(group):
            return None  # plain error feedback (DGC with m = 0)
        return Hyper(float(group["momentum"]), float(group.get("dampening", 0.0)),
                     bool(group.get("nesterov", False)), float(group.get("weight_decay", 0.0)))

    def continue_from_buffers(self) -> None:
        """Compression starts after uncompressed steps: at its next hand-over, each velocity
        starts from the momentum SGD has built (the buffers are read then, once the updates
        an overlap plan defers into the forward pass are applied)."""
        self._continuing = [True] * len(self.params)

    def _continue(self, index: int, hyper: Hyper) -> None:
        self._continuing[index] = False
        optimizer = self._optimizer()
        buffer = None if optimizer is None \
            else optimizer.state.get(self.params[index], {}).get("momentum_buffer")
        if buffer is None:
            return
        velocity = self.velocities[index]
        velocity.copy_(buffer.reshape(velocity.shape))
        if hyper.nesterov:
            velocity.mul_(hyper.momentum)

    def accumulate(self, index: int, grad: torch.Tensor, accumulator: torch.Tensor) -> bool:
        """v += the corrected velocity of `grad` (shaped as `accumulator`); False where the
        group has no momentum to correct, and nothing was done."""
        hyper = self._used[index] = self._hyper(index)
        if hyper is None:
            self._continuing[index] = False
            return False
        if self._continuing[index]:
            self._continue(index, hyper)
        if hyper.weight_decay:
            param = self.params[index].detach().reshape(accumulator.shape)
            grad = grad.add(param, alpha=hyper.weight_decay * self._decay_share)
        dgc_accumulate_(self.velocities[index], accumulator, grad, hyper.momentum,
                        hyper.nesterov)
        return True

    def mask(self, index: int, accumulator: torch.Tensor, indices: torch.Tensor) -> None:
        """Momentum-factor masking where `indices` were sent (no-op without correction)."""
        if self._used[index] is not None:
            dgc_mask_(self.velocities[index], accumulator, indices)

    def to_gradient(self, index: int, out: torch.Tensor) -> None:
        """Turns the exchanged update in `out` into the gradient from which the user's SGD
        makes exactly that update; zeroes the momentum buffer it will read."""
        hyper = self._used[index]
        optimizer = self._optimizer()
        if hyper is None or optimizer is None:
            return
        param = self.params[index]
        if not bool(torch.isfinite(out).all()):
            # An overflow (fp16 under a GradScaler) reached every rank through the exchange:
            # the scaler skips this step, and a skipped step must leave SGD's state as it was.
            self.velocities[index].nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            return
        buffer = optimizer.state.get(param, {}).get("momentum_buffer")
        if buffer is not None:
            buffer.zero_()
        factor = sgd_momentum_factor(hyper.momentum, hyper.dampening, hyper.nesterov,
                                     first_step=buffer is None)
        if factor != 1.0:
            out.div_(factor)
        if hyper.weight_decay:
            out.view(-1).add_(param.detach().reshape(-1), alpha=-hyper.weight_decay)
        self.velocities[index].nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    def load(self, velocities: Sequence[torch.Tensor]) -> None:
        for mine, theirs in zip(self.velocities, velocities, strict=True):
            mine.copy_(theirs)


def correction_for(lossy: LossyCompression, optimizer: torch.optim.Optimizer,
                   base_cls: type[torch.optim.Optimizer], params: Sequence[torch.Tensor],
                   shapes: Sequence[tuple[int, ...]], world_size: int, average: bool
                   ) -> MomentumCorrection | None:
    """The correction top-k applies under `optimizer`, or None; warns (once per wrap) where a
    lossy compressor runs under momentum it cannot correct (Note [DGC under the user's
    momentum]: PowerSGD never warns)."""
    if not isinstance(lossy, TopK) or not params:
        return None
    what = uncorrected_momentum(optimizer, base_cls, params)
    if what is not None:
        warnings.warn(NO_CORRECTION.format(what=what), UserWarning, stacklevel=6)
    if not steps_as_sgd(base_cls):
        return None
    return MomentumCorrection(optimizer, params, shapes, 1.0 if average else 1.0 / world_size)
