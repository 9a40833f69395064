"""Horovod process sets (``process_set=``): a wrapped optimizer, or a broadcast, over a subset
of the ranks.

A process set is Horovod's ``hvd.ProcessSet`` (from ``hvd.add_process_set``; its ``ranks``) or
a plain sequence of global ranks. commsched runs it on a view of the world (`World` with
``members`` set): ``rank`` and ``size`` are within the set, its groups hold the members only
(world.groups), and everything built on a world (the plan, the consistency checks, the engine's
heartbeats and the failure diagnosis) then works within the set unchanged.

As in Horovod, a rank outside the set reduces nothing: its optimizer steps on its local
gradients. It gets a world of one (no group, no peer), so the same code runs there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from .groups import subgroup
from .view import World


def members_of(process_set: Any, world_size: int) -> tuple[int, ...] | None:
    """The global ranks of `process_set`, sorted; None when it is the whole world (None,
    Horovod's global process set, or every rank)."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return None
    ranks = getattr(process_set, "ranks", process_set)
    if ranks is None or not isinstance(ranks, Sequence) or isinstance(ranks, str) \
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ValueError(f"process_set must be a Horovod ProcessSet made from a list of ranks, or "
                         f"a list of ranks, got {process_set!r}")
    members = tuple(sorted(set(ranks)))
    if len(members) != len(ranks):
        raise ValueError(f"process_set lists a rank twice: {list(ranks)}")
    if not members or members[0] < 0 or members[-1] >= world_size:
        raise ValueError(f"process_set {list(ranks)} must hold ranks of 0..{world_size - 1}")
    return None if len(members) == world_size else members


def world_for(world: World, process_set: Any) -> World:
    """The world a wrapped optimizer with `process_set` runs on (see the module's text). Every
    member calls this at the same point of its program (as every rank does for the whole world);
    the view is made once per set and kept until commsched.shutdown()."""
    members = members_of(process_set, world.size)
    if members is None:
        return world
    if world.rank not in members or len(members) == 1:
        return World(0, 1, world.local_rank, world.launcher, None, None, False, world.timeout,
                     members=(world.rank,), parent=world)
    view = world.subsets.get(members)
    if view is None:
        backend = dist.get_backend(world.process_group)
        data = subgroup(members, backend, world.timeout)
        control = data if backend == "gloo" else subgroup(members, "gloo", world.timeout)
        view = World(members.index(world.rank), len(members), world.local_rank, world.launcher,
                     data, control, False, world.timeout, world.store_address,
                     world.liveness, members=members, parent=world)
        world.subsets[members] = view
    return view


def root_within(world: World, root_rank: int) -> int:
    """Horovod names a broadcast's root by its global rank, also within a process set."""
    if world.members is None:
        return root_rank
    if root_rank not in world.members:
        raise ValueError(f"root_rank {root_rank} is not in the process set {list(world.members)}")
    return world.members.index(root_rank)
