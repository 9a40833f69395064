"""Process groups over a subset of the ranks (a process set), made by its members alone.

``dist.new_group(ranks)`` must be called by every rank of the world, and its
``use_local_synchronization=True`` variant (members only) names the group after the number of
groups this rank holds now, which differs across ranks as soon as one of them has released a
dropped optimizer's group (at garbage collection, whose timing is per process): the members then
rendezvous under different names and hang. Here the name is the members and a count of groups
made for those members on this rank, equal on every member as long as they wrap in the same
order, which every commsched group already requires.

Note [private c10d helper]
There is no public call that makes a member-only group under a name of the caller's choosing,
so this uses ``distributed_c10d._new_process_group_helper`` (what ``new_group`` itself calls)
and registers the rank mapping as ``new_group`` does. A torch without it fails here with a
clear error, at wrap time.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

_made: dict[tuple[int, ...], Iterator[int]] = {}
_alive: weakref.WeakSet[Any] = weakref.WeakSet()  # every group commsched made, while it lives


def track(group: Any) -> Any:
    """Registers a group commsched made (see Note [groups at exit]); returns it."""
    if group is not None:
        _alive.add(group)
    return group


def _keep_alive_at_exit() -> None:
    """Note [groups at exit]
    A Gloo group's destructor joins its worker threads, and one may sit in a collective waiting for
    a peer that never comes (a stuck rank: the very failure the job is exiting with) until the
    group's timeout, minutes. At interpreter exit the groups of optimizers still alive would be
    destroyed as the interpreter clears its objects; the process is ending and the OS reclaims
    everything, so each gets one reference that is never dropped. (A dropped optimizer's group is
    destroyed as soon as it goes, by its session's release.)"""
    for group in list(_alive):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


atexit.register(_keep_alive_at_exit)


def subgroup(members: tuple[int, ...], backend: str, timeout: float) -> Any:
    """A new group of `members` (global ranks, sorted; this rank among them), made by the
    members only: the others need not call this."""
    from torch.distributed import distributed_c10d as c10d

    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is None or not hasattr(c10d, "_world"):
        raise RuntimeError("commsched: process sets need torch.distributed's "
                           "_new_process_group_helper, which this torch lacks")
    rank = dist.get_rank()
    if rank not in members:
        raise ValueError(f"commsched: rank {rank} makes a group of {list(members)} without "
                         "being a member")
    count = next(_made.setdefault(members, itertools.count()))
    name = f"commsched_set_{'_'.join(map(str, members))}_{count}"
    _, store = c10d._world.pg_map[c10d._get_default_group()]
    made = helper(len(members), members.index(rank), list(members), backend, store, name,
                  timeout=datetime.timedelta(seconds=timeout))
    group = made[0] if isinstance(made, tuple) else made
    c10d._world.pg_group_ranks[group] = {g: i for i, g in enumerate(members)}
    return track(group)


def forget() -> None:
    """At shutdown: the world's groups are gone, a new world counts from zero again."""
    _made.clear()
