"""Prophet (Zhang et al., ICPP'21): predictable block grouping from the profiled ready pattern.

Gradients arrive in steps: a gap between consecutive ready times larger than twice the mean gap
starts a new step. In the interval before step k+1 arrives, the channel can carry
(interval - alpha) * bandwidth bytes; that much of the highest-priority ready partitions goes
out as one block. When backward has ended, what is left goes in priority order, in blocks of at
most `partition_bytes`. Bandwidth is the fitted 1/beta, not a constant (the public Prophet code
hard-codes 1 Gb/s and one model's step table).
"""

from __future__ import annotations

import statistics

from ..config import Config
from .partitions import Partition, partition
from .types import Block, NetModel, Profile, TensorSpec


def ready_steps(times: list[float]) -> list[float]:
    """Start times of the steps of a sorted list of ready times."""
    if not times:
        return []
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean_gap = statistics.fmean(gaps) if gaps else 0.0
    starts = [times[0]]
    for gap, t in zip(gaps, times[1:], strict=True):
        if gap > 2 * mean_gap and gap > 0:
            starts.append(t)
    return starts


def _fill(candidates: list[Partition], capacity: float) -> list[Partition]:
    chosen, used = [], 0
    for part in sorted(candidates, key=lambda p: p.priority):
        if used + part.nbytes <= capacity:
            chosen.append(part)
            used += part.nbytes
    return chosen


def _group_dtype(parts: list[Partition]) -> list[list[Partition]]:
    by_dtype: dict[str, list[Partition]] = {}
    for part in parts:
        by_dtype.setdefault(part.spec.dtype, []).append(part)
    return list(by_dtype.values())


def plan_prophet(specs: list[TensorSpec], profile: Profile, net: NetModel,
                 cfg: Config) -> tuple[Block, ...]:
    parts = partition(specs, profile, cfg.partition_bytes)
    starts = ready_steps(sorted(p.ready for p in parts))
    groups: list[list[Partition]] = []
    sent: set[int] = set()
    free_at = 0.0
    for k in range(len(starts) - 1):
        next_start = starts[k + 1]
        # The step's burst has arrived by its last ready time before the next step starts.
        burst_end = max(p.ready for p in parts if p.ready < next_start)
        begin = max(free_at, burst_end)
        capacity = (next_start - begin - net.alpha) / net.beta if net.beta > 0 else float("inf")
        ready = [p for p in parts if id(p) not in sent and p.ready <= burst_end]
        chosen = _fill(ready, capacity)
        for group in _group_dtype(chosen):
            groups.append(group)
            free_at = begin = begin + net.time(sum(p.nbytes for p in group))
            sent.update(id(p) for p in group)
    rest = sorted((p for p in parts if id(p) not in sent), key=lambda p: p.priority)
    current: list[Partition] = []
    for part in rest:
        if current and (current[0].spec.dtype != part.spec.dtype or
                        sum(p.nbytes for p in current) + part.nbytes > cfg.partition_bytes):
            groups.append(current)
            current = []
        current.append(part)
    if current:
        groups.append(current)
    return tuple(Block(i, tuple(p.piece for p in g), g[0].spec.dtype) for i, g in enumerate(groups))
