"""Discrete-event simulation of training iterations: profile x plan x network -> timeline.

The model follows the engine (csrc/engine.cpp) and the optimizer wrapper:
* one compute timeline (the training thread) and one serial communication channel per rank;
  every rank is taken as identical, so one rank stands for all;
* the channel runs the plan's blocks strictly in plan order (see channel.Channel). Credit
  (bytes in flight) is not modelled: on a serial channel it paces launches but does not change
  when a block finishes;
* SYNC (horovod, ddp, mgwfbp): t=0 is the end of the previous step(); the first gradient is
  ready at compute.before_first_ready_s, tensor i ready_time_s later; step() waits for every
  block, then the optimizer's update takes compute.step_s;
* OVERLAP (bytescheduler, prophet, dear): see overlap.py;
* with `shards` > 1, shard_optimizer's plan and update: see sharded.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..plan import Plan
from ..plan.sharding import sharded_plan
from .channel import (
    OP_LABEL,
    BlockTimes,
    Channel,
    SimEvent,
    block_positions,
    block_times,
    wire_bytes,
)
from .network import Network
from .profile import RunProfile
from .sharded import run_sharded_sync, shard_steps
from .timing import CompressorCompute, ComputeTimes, compute_times


class Mode(enum.StrEnum):
    SYNC = "sync"  # Horovod semantics: step() waits for every block
    OVERLAP = "overlap"  # cross-iteration: updates applied in the next forward's pre-hooks


@dataclass
class SimResult:
    iteration_s: float  # steady-state period: the last simulated iteration
    events: list[SimEvent]  # the last iteration's timeline (see SimEvent)
    comm_busy_s: float  # channel busy time per iteration: the sum of the plan's collective times
    compute_s: float  # training-thread compute in the last iteration (waits excluded)
    wire_bytes: float  # bytes one rank sends per iteration
    wait_s: float = 0.0  # training-thread time blocked on communication in the last iteration
    notes: list[str] = field(default_factory=list)  # fallbacks used for missing profile fields

    @property
    def network_busy_fraction(self) -> float:
        return min(self.comm_busy_s / self.iteration_s, 1.0) if self.iteration_s > 0 else 0.0


# One simulated run: start time of each iteration (plus the end of the last), the compute and
# wait spans of the last iteration (absolute times), and the channel with every block's span.
Trace = tuple[list[float], list[SimEvent], Channel]


def simulate(run: RunProfile, plan: Plan, net: Network, mode: Mode,
             iterations: int = 4, compressor: CompressorCompute | None = None,
             shards: int = 1) -> SimResult:
    """Simulates `iterations` iterations and reports the last one (the steady state: the first
    overlapped iteration has no previous iteration's communication to wait for).

    Args:
        run: the profile.
        plan: the plan (under sharding, the unsharded one the policy planned).
        net: the network.
        mode: synchronous or cross-iteration.
        iterations: how many to simulate.
        compressor: the compute a lossy compressor adds.
        shards: the number of ranks the optimizer state is divided among (shard_optimizer;
            1: not sharded): the sharded plan's traffic and each rank's share of the update.

    Returns:
        The last iteration.

    Raises:
        ValueError: a bad iteration count, overlap mode without module information, or
            sharding with a compressor.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if shards > 1 and compressor is not None:
        raise ValueError("a sharded plan runs no compressor (shard_optimizer refuses one)")
    wire = sharded_plan(plan) if shards > 1 else plan
    blocks = block_times(run, wire, net)
    compute = compute_times(run, with_modules=mode is Mode.OVERLAP)
    own = run.step_s if run.update_shards == shards else None  # the profile's own sharded run
    steps = shard_steps(plan, blocks, compute.update, shards, own) if shards > 1 else ()
    notes = blocks.notes + compute.notes
    if mode is Mode.OVERLAP:
        if not run.has_module_info:
            raise ValueError(f"profile {run.source}: overlap mode needs 'modules' and "
                             "tensors[].module (a profile recorded with model=)")
        from .overlap import run_overlap

        trace = run_overlap(run, wire, blocks, compute, iterations, compressor, steps)
        if iterations == 1:
            notes.append("one iteration only: its forward applies no previous updates")
    elif steps:
        trace = run_sharded_sync(wire, blocks, compute, steps, iterations)
    else:
        trace = run_sync(plan, blocks, compute, iterations, compressor)
    return _result(wire, net, blocks, trace, notes)


def run_sync(plan: Plan, blocks: BlockTimes, compute: ComputeTimes, iterations: int,
             compressor: CompressorCompute | None = None) -> Trace:
    channel = Channel(plan, blocks.durations)
    events: list[SimEvent] = []
    last_ready = max(blocks.ready, default=0.0)
    starts = [0.0]
    after = block_positions(plan, compressor.after) if compressor else set()
    waited = block_positions(plan, compressor.waited_for) if compressor else set()
    for _ in range(iterations):
        start = starts[-1]
        channel.reset()
        events = []
        first = start + compute.before_first_ready_s
        backward_end = first + last_ready
        forward = set(blocks.forward)
        for pos in range(len(plan.blocks)):
            if pos in after:
                break  # the compressor's blocks are last in the plan (plan/compressed.py)
            # step() launches forward-stage blocks too: they go when backward has ended.
            channel.offer(pos, backward_end if pos in forward
                          else first + blocks.ready_after_first[pos])
        events.append(SimEvent("compute", "forward", start, first))
        events.append(SimEvent("compute", "backward", first, backward_end))
        free = backward_end
        if compressor is not None:
            begin = max([backward_end] + [channel.done_at(p) for p in waited])
            free = begin + compressor.seconds
            if begin > backward_end:
                events.append(SimEvent("wait", "synchronize", backward_end, begin))
            events.append(SimEvent("compute", "compress", begin, free))
            for pos in sorted(after):
                channel.offer(pos, free)
        synced = max(free, channel.all_done())
        if synced > free:
            events.append(SimEvent("wait", "synchronize", free, synced))
        events.append(SimEvent("compute", "update", synced, synced + compute.step_s))
        starts.append(synced + compute.step_s)
    return starts, events, channel


def _result(plan: Plan, net: Network, blocks: BlockTimes, trace: Trace,
            notes: list[str]) -> SimResult:
    starts, events, channel = trace
    begin, end = starts[-2], starts[-1]
    # The last iteration's own spans, plus every block on the wire during it.
    window = [e for e in events if e.end_s > e.start_s]
    for pos, s, f in channel.spans:
        if f > begin and s < end:
            block = plan.blocks[pos]
            window.append(SimEvent("network", OP_LABEL[block.op], s, f, block.block_id,
                                   blocks.nbytes[pos]))
    shifted = sorted((SimEvent(e.lane, e.name, e.start_s - begin, e.end_s - begin, e.block_id,
                               e.nbytes) for e in window), key=lambda e: (e.start_s, e.lane))
    return SimResult(
        iteration_s=end - begin, events=shifted, comm_busy_s=sum(blocks.durations),
        compute_s=sum(e.duration_s for e in shifted if e.lane == "compute"),
        wire_bytes=wire_bytes(plan, blocks, net),
        wait_s=sum(e.duration_s for e in shifted if e.lane == "wait"),
        notes=list(dict.fromkeys(notes)))
