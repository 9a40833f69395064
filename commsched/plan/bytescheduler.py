"""ByteScheduler (Peng et al., SOSP'19): partitions, priority by forward order, credit.

Every tensor is split into partitions of `partition_bytes`; whenever the channel is free, the
ready partition with the highest priority (smallest forward index: needed soonest in the next
forward pass) goes next. The static plan replays that rule on the profiled ready times with the
fitted collective cost, so every rank derives the same order; at run time the engine only paces
launches by `credit_bytes` in flight and never reorders.
"""

from __future__ import annotations

import heapq

from ..config import Config
from .partitions import Partition, partition
from .types import Block, NetModel, Profile, TensorSpec


def priority_order(parts: list[Partition], net: NetModel) -> list[Partition]:
    """List scheduling on one serial channel: at each free moment, the best ready partition."""
    waiting = sorted(parts, key=lambda p: (p.ready, p.priority))
    ready: list[tuple[tuple[int, int], int, Partition]] = []
    order: list[Partition] = []
    clock, i = 0.0, 0
    while len(order) < len(parts):
        while i < len(waiting) and waiting[i].ready <= clock:
            heapq.heappush(ready, (waiting[i].priority, i, waiting[i]))
            i += 1
        if not ready:
            clock = waiting[i].ready
            continue
        _, _, best = heapq.heappop(ready)
        order.append(best)
        clock += net.time(best.nbytes)
    return order


def plan_bytescheduler(specs: list[TensorSpec], profile: Profile, net: NetModel,
                       cfg: Config) -> tuple[Block, ...]:
    order = priority_order(partition(specs, profile, cfg.partition_bytes), net)
    return tuple(Block(i, (p.piece,), p.spec.dtype) for i, p in enumerate(order))
