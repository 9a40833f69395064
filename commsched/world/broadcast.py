"""Horovod's broadcast calls: broadcast_parameters, broadcast_optimizer_state, broadcast_object.

Like Horovod's, they need nothing but an initialised launcher: the first call initialises
commsched's world (as a wrapped optimizer would), so that they can be used before any wrap,
e.g. right after ``hvd.init()``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .bootstrap import init
from .process_sets import root_within, world_for


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Copies parameters from `root_rank`: a state_dict or dict (sorted by name, as Horovod), or
    a list of (name, tensor) pairs or of tensors."""
    w = init()
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    if w.size == 1:
        return
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is not a tensor")
        dist.broadcast(tensor.data, src=root_rank, group=w.process_group)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: Any = None) -> None:
    """Makes every rank's optimizer state and hyper-parameters equal to `root_rank`'s.

    A fresh optimizer has no state yet, so that a rank that has none would keep none, whatever
    root holds (and root's own state would be empty too): as Horovod does, one step with zero
    gradients first makes every state tensor exist. Unlike Horovod's, that step changes no
    parameter (weight decay would) and gradients that existed are put back; parameters that
    had none keep the zeros, as with Horovod. `model` (Horovod's argument) marks the
    parameters of sparse embeddings, whose zero gradients are then sparse."""
    w = init()
    if not optimizer.state and not isinstance(optimizer, torch.optim.LBFGS):
        _initialise_state(optimizer, model)  # also alone, as Horovod: the state then exists
    if w.size == 1:
        return
    state = w.broadcast_object(optimizer.state_dict() if w.rank == root_rank else None,
                               root=root_rank)
    if w.rank != root_rank:
        optimizer.load_state_dict(state)


def _initialise_state(optimizer: torch.optim.Optimizer, model: Any) -> None:
    """One zero-gradient step of the optimizer alone (no reduction: only this rank calls it)."""
    sparse_ids = set()
    if isinstance(model, torch.nn.Module):
        sparse_ids = {id(p) for m in model.modules() if getattr(m, "sparse", False) is True
                      for p in m.parameters(recurse=False)}
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    for p in params:
        zeros = torch.zeros_like(p)
        sparse = isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse_ids
        p.grad = zeros.to_sparse() if sparse else zeros
    # Note [local step]: a commsched wrapper's step() reduces gradients, which every rank would
    # have to call; `_cs_local_step` is its user optimizer's own step.
    local_step = getattr(optimizer, "_cs_local_step", optimizer.step)
    with torch.no_grad():
        local_step()
        for p, value, grad in saved:
            p.copy_(value)
            if grad is not None:
                p.grad = grad


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Any:
    """`obj` as `root_rank` has it (a global rank, also with a process set, as in Horovod).
    `name` is accepted for Horovod's signature: commsched's broadcasts are ordered by the
    group's call order, not matched by name."""
    del name
    w = world_for(init(), process_set)
    return w.broadcast_object(obj, root=root_within(w, root_rank))
