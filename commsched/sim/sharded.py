"""shard_optimizer in the simulator: the sharded plan's traffic and its update, as
runtime/modes/shard_state.py runs them.

The wire carries plan/sharding.py's sharded plan: every block reduce-scattered in backward, and
all-gathered after the update (a synchronous plan's all-gathers appended, released one by one
as step() updates each block; DeAR's kept in place, released in the next forward pass). Each
rank steps its slice of every block, one optimizer call per block in the reduce-scatters'
order, each as soon as that reduce-scatter is done: a call on 1/N of the block's bytes, at the
profile's cost of one call (ComputeTimes.update), scaled to the run's own step_s where the
profile is of the same sharded run. The copies of the gathered parameters into place are the
forward's time in the profile (before_first_ready_s), not charged again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Plan
from ..plan.sharding import gather_positions
from ..plan.update_groups import UpdateCost
from .channel import BlockTimes, Channel, SimEvent
from .timing import ComputeTimes


@dataclass(frozen=True)
class ShardStep:
    """One block's update on one rank: after the reduce-scatter at `reduce_position`, the
    optimizer call on this rank's slice (`update_s`), then the all-gather at `gather_position`
    may go (plan positions of the sharded plan, which keeps the unsharded plan's)."""

    reduce_position: int
    gather_position: int
    update_s: float


def shard_steps(plan: Plan, blocks: BlockTimes, update: UpdateCost, shards: int,
                measured_s: float | None = None) -> tuple[ShardStep, ...]:
    """Every block's update when `plan` (the unsharded plan) runs sharded over `shards` ranks.

    Args:
        plan: the unsharded plan.
        blocks: block_times of the sharded plan (positions are shared).
        update: the cost of one optimizer call.
        shards: the number of ranks the state is divided among.
        measured_s: where the profile is of this sharded run, its step_s: the updates' whole
            time, which also holds what surrounds each call (the slice's gradient averaged, the
            new values written where the all-gather packs from). The calls' costs are scaled to
            sum to it.

    Returns:
        One step per reduced block, in the order the runtime takes them.
    """
    pairs = sorted(gather_positions(plan).items())
    seconds = [update.time(-(-blocks.nbytes[reduce] // shards)) for reduce, _ in pairs]
    total = sum(seconds)
    scale = measured_s / total if measured_s is not None and total > 0 else 1.0
    return tuple(ShardStep(reduce, gather, scale * s)
                 for (reduce, gather), s in zip(pairs, seconds, strict=True))


def run_sharded_sync(plan: Plan, blocks: BlockTimes, compute: ComputeTimes,
                     steps: tuple[ShardStep, ...], iterations: int
                     ) -> tuple[list[float], list[SimEvent], Channel]:
    """A synchronous policy's sharded iterations: the reduce-scatters go as gradients are
    ready; step() waits for each in turn, updates its slice and releases its all-gather, then
    waits for every all-gather. `plan` is the sharded plan."""
    channel = Channel(plan, blocks.durations)
    last_ready = max(blocks.ready, default=0.0)
    forward = set(blocks.forward)
    starts = [0.0]
    events: list[SimEvent] = []
    for _ in range(iterations):
        start = starts[-1]
        channel.reset()
        first = start + compute.before_first_ready_s
        t = first + last_ready
        for pos in range(len(plan.blocks)):
            if pos not in forward:
                channel.offer(pos, first + blocks.ready_after_first[pos])
        events = [SimEvent("compute", "forward", start, first),
                  SimEvent("compute", "backward", first, t)]
        for step in steps:
            done = channel.done_at(step.reduce_position)
            if done > t:
                events.append(SimEvent("wait", "step", t, done))
                t = done
            events.append(SimEvent("compute", "update", t, t + step.update_s))
            t += step.update_s
            channel.offer(step.gather_position, t)
        synced = max(t, channel.all_done())
        if synced > t:
            events.append(SimEvent("wait", "synchronize", t, synced))
        starts.append(synced)
    return starts, events, channel
