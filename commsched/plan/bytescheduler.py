"""ByteScheduler (Peng et al., SOSP'19): partitions, priority by forward order, credit.

Every tensor is split into partitions of `partition_bytes`; whenever the channel is free, the
ready partition with the highest priority (smallest forward index: needed soonest in the next
forward pass) goes next. The static plan replays that rule on the profiled ready times with the
fitted collective cost, so every rank derives the same order; at run time the engine only paces
launches by `credit_bytes` in flight and never reorders.

Unlike the paper, the block that leaves at a free moment is filled up to `partition_bytes` with
further ready partitions of the same dtype, still in priority order. A Transformer has dozens of
bias and norm tensors of a few hundred bytes; sent one collective each, their fixed cost (alpha)
adds up to more than their bytes, and each is one more tiny optimizer call in the next forward.
Only partitions already ready at that moment join, so fusing never delays the block.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..config import Config
from .partitions import Partition, partition
from .types import Block, NetModel, Profile, TensorSpec


def priority_order(parts: list[Partition], net: NetModel,
                   block_bytes: Callable[[float], float]) -> list[list[Partition]]:
    """List scheduling on one serial channel: at each free moment, the best ready partitions,
    fused up to `block_bytes(moment)` (at least one partition goes)."""
    waiting = sorted(parts, key=lambda p: (p.ready, p.priority))
    ready: list[tuple[tuple[int, int], int, Partition]] = []
    blocks: list[list[Partition]] = []
    clock, i, placed = 0.0, 0, 0
    while placed < len(parts):
        while i < len(waiting) and waiting[i].ready <= clock:
            heapq.heappush(ready, (waiting[i].priority, i, waiting[i]))
            i += 1
        if not ready:
            clock = waiting[i].ready
            continue
        block = _fill_block(ready, block_bytes(clock))
        blocks.append(block)
        placed += len(block)
        clock += net.time(sum(p.nbytes for p in block))
    return blocks


def _fill_block(ready: list[tuple[tuple[int, int], int, Partition]],
                block_bytes: float) -> list[Partition]:
    """Pops the best ready partition, then the next best of its dtype while they fit."""
    block = [heapq.heappop(ready)[2]]
    size, skipped = block[0].nbytes, []
    while ready and size < block_bytes:
        entry = heapq.heappop(ready)
        part = entry[2]
        if part.spec.dtype == block[0].spec.dtype and size + part.nbytes <= block_bytes:
            block.append(part)
            size += part.nbytes
        else:
            skipped.append(entry)
    for entry in skipped:
        heapq.heappush(ready, entry)
    return block


def plan_bytescheduler(specs: list[TensorSpec], profile: Profile, net: NetModel,
                       cfg: Config) -> tuple[Block, ...]:
    parts = partition(specs, profile, cfg.partition_bytes)
    return tuple(Block(i, tuple(p.piece for p in group), group[0].spec.dtype)
                 for i, group in enumerate(priority_order(parts, net,
                                                          lambda _: cfg.partition_bytes)))
