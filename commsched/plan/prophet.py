"""Prophet (Zhang et al., ICPP'21): blocks sized from the predictable, stepwise arrival of
gradients.

In the paper's terms: gradients are generated in *steps* (bursts of layers whose backward ends
together, separated by longer computation); the profiled *gradient generation pattern* repeats
every iteration, so the whole *block* schedule can be planned once. A block is a group of
gradients sent as one transfer, never preempted. Its size follows from the profile:

* a step starts where the gap between consecutive ready times exceeds twice the mean gap
  (`ready_steps`);
* whenever the channel becomes free at time t with the next step due at s, the block holds the
  highest-priority ready gradients (priority = forward order, as in ByteScheduler) up to the
  bytes the fitted network carries before s: (s - t - alpha) / beta, and never less than
  `partition_bytes`. The transfer then ends as the next step's gradients arrive, so they are
  not stuck behind a lower-priority block (no preemption needed), and the gap is filled with one
  collective instead of many: each partition saved is one alpha (and one optimizer call in the
  next forward) saved;
* once the last step has arrived nothing new can overtake, and what is left goes in priority
  order in blocks of at most `partition_bytes`, so the next forward's first updates can start
  while later blocks are still on the wire.

This is ByteScheduler's priority rule with Prophet's block sizing: with one step, or with gaps
too short to carry more than a partition, the two plans are the same. Bandwidth is the fitted
1/beta, not a constant (the public Prophet code hard-codes 1 Gb/s and one model's step table).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable

from ..config import Config
from .bytescheduler import priority_order
from .partitions import partition
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


def step_block_bytes(steps: list[float], net: NetModel,
                     floor_bytes: int) -> Callable[[float], float]:
    """Bytes a block leaving at `clock` may hold: what the channel carries before the next step
    arrives, at least `floor_bytes`; after the last step, `floor_bytes`."""
    def limit(clock: float) -> float:
        upcoming = bisect.bisect_right(steps, clock)
        if upcoming == len(steps) or net.beta <= 0:
            return floor_bytes
        return max(float(floor_bytes), (steps[upcoming] - clock - net.alpha) / net.beta)
    return limit


def plan_prophet(specs: list[TensorSpec], profile: Profile, net: NetModel,
                 cfg: Config) -> tuple[Block, ...]:
    parts = partition(specs, profile, cfg.partition_bytes)
    steps = ready_steps(sorted(p.ready for p in parts))
    groups = priority_order(parts, net, step_block_bytes(steps, net, cfg.partition_bytes))
    return tuple(Block(i, tuple(p.piece for p in g), g[0].spec.dtype) for i, g in enumerate(groups))
