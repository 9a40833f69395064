"""Releasing a dropped wrapper's engine, groups and hooks.

Note [a dropped optimizer releases its engine]
Nothing the engine, the hooks or the groups hold refers back to the optimizer or its session
(the hooks and the engine's iteration read them through weak references), so a dropped wrapper
is collected, and a `weakref.finalize` on it then stops the engine's threads and destroys its
groups; `Session.close()` runs it at once. Only the thread that wrapped releases: one elsewhere
(a garbage collection in a heartbeat thread) leaves it to the next wrap or commsched.shutdown(),
since destroying a group from a foreign thread can block on the training thread's collectives.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .engine.handle import EngineHandle
from .intake.sparse_route import SparseExchange
from .modes.overlap.runner import OverlapRunner


@dataclass
class Resources:
    """What a session holds that outlives it unless released: the engine (its threads and
    group), the sparse route's group, the gradient hooks and the overlap runner's module hooks
    (which would otherwise wait for the stopped engine in the model's next forward pass or
    state_dict()); and the thread that may release them. Nothing here refers to the session or
    the optimizer."""

    engine: EngineHandle | None  # None until the session binds (Note [Elastic Horovod])
    sparse: SparseExchange | None
    hooks: list[Any]
    owner: int
    runner: OverlapRunner | None = None


_orphans: list[Resources] = []  # collected in another thread, released by the next wrap


def release(resources: Resources) -> None:
    if threading.get_ident() != resources.owner:
        _orphans.append(resources)
        return
    for handle in resources.hooks:
        handle.remove()
    resources.hooks.clear()
    if resources.runner is not None:
        resources.runner.remove()
    if resources.engine is not None:
        resources.engine.shutdown()
    if resources.sparse is not None:
        resources.sparse.close()


def release_orphans() -> None:
    while _orphans:
        resources = _orphans.pop()
        resources.owner = threading.get_ident()
        release(resources)
