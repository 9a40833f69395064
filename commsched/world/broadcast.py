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
    """Copies tensors from `root_rank` to every rank, in place, as Horovod's call does.

    Call it on every rank after building the model (and after loading a checkpoint on the root)
    so that all ranks start from the same parameters; buffers travel too when `params` is a
    ``state_dict()``. It initialises commsched if nothing did yet.

    Args:
        params: ``model.state_dict()`` or another dict of tensors (sent in name order, as
            Horovod), or ``model.named_parameters()`` (pairs of name and tensor), or tensors.
            Every rank passes the same names, shapes and dtypes, in the same order.
        root_rank: the global rank whose values every rank receives.

    Raises:
        ValueError: an entry of `params` is not a tensor (checked with more than one rank).
        RuntimeError: torch.distributed's broadcast failed or timed out.
    """
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

    Call it on every rank after broadcast_parameters(), or after loading a checkpoint on the
    root only. A fresh optimizer has no state yet, so that a rank that has none would keep none,
    whatever root holds (and root's own state would be empty too): as Horovod does, one step
    with zero gradients, on each rank alone, first makes every state tensor exist. Unlike
    Horovod's, that step changes no parameter (weight decay would) and gradients that existed
    are put back; parameters that had none keep the zeros, as with Horovod. For a wrapped
    optimizer the root's ``state_dict()`` carries its ``commsched`` entry, so the others also
    take its plan and position (DistributedOptimizer.load_state_dict()). It initialises
    commsched if nothing did yet.

    Args:
        optimizer: the optimizer to align, wrapped by DistributedOptimizer or plain; the same
            class and parameters on every rank.
        root_rank: the global rank whose state every rank receives.
        model: Horovod's argument: the model, whose ``sparse=True`` modules' parameters then
            get sparse zero gradients in the initialising step (as their optimizer expects).

    Raises:
        ValueError: the root's state does not fit this rank's optimizer (torch's
            load_state_dict(), or a ``commsched`` entry for another plan or other tensors).
        RuntimeError: torch.distributed's broadcast failed or timed out.
    """
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
    # Note [local step]
    # A commsched wrapper's step() reduces gradients, which every rank would have to call;
    # `_cs_local_step` is its user optimizer's own step.
    local_step = getattr(optimizer, "_cs_local_step", optimizer.step)
    with torch.no_grad():
        local_step()
        for p, value, grad in saved:
            p.copy_(value)
            if grad is not None:
                p.grad = grad


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Returns `obj` as `root_rank` has it, on every rank: Horovod's broadcast_object.

    Use it for small picklable values the ranks must agree on (an epoch to resume from, a
    random seed). It initialises commsched if nothing did yet.

    Args:
        obj: any picklable object; only the root's is read.
        root_rank: the global rank that sends, also with a process set (as in Horovod).
        name: accepted for Horovod's signature and ignored: commsched's broadcasts are matched
            by the order of the calls, not by name.
        process_set: an ``hvd.ProcessSet`` or a list of global ranks: the broadcast runs among
            its members only, and only they call it. None: the whole world.

    Returns:
        The root's `obj` (the root gets its own back).

    Raises:
        ValueError: `root_rank` is not a member of `process_set`, or `process_set` is malformed
            or holds ranks outside the world.
        RuntimeError: torch.distributed's broadcast failed or timed out.
    """
    del name
    w = world_for(init(), process_set)
    return w.broadcast_object(obj, root=root_within(w, root_rank))
