"""Cross-iteration overlap (bytescheduler, prophet, dear), as commsched/overlap.py runs it.

step() launches what is left and returns at once. In the next forward pass, the pre-hook of
module m (modules in profiled forward order, each taking its own forward time):
  1. for DeAR plans releases the all-gathers up to one past the one m needs (step() released
     the first), one block of look-ahead;
  2. waits until the block that completes m's tensors (the last all-reduce holding a piece of
     them, or their all-gather) is done;
  3. applies their update: the optimizer's step_s times their share of all gradient bytes.
At the end of the forward (the root module's hook) every block is waited for and the updates of
tensors no module claimed are applied. Then loss and the start of backward take what is left of
before_first_ready_s after the forward, and the gradients follow at their ready times; the
backward-stage blocks of this iteration run while the next forward runs.
"""

from __future__ import annotations

from ..plan import Collective, Plan
from .channel import BlockTimes, Channel, SimEvent
from .profile import RunProfile
from .timing import ComputeTimes


def completing_blocks(plan: Plan) -> dict[int, int]:
    """Tensor id -> plan position of the block whose completion makes its update possible."""
    completing = Collective.ALL_GATHER if any(b.op is Collective.ALL_GATHER for b in plan.blocks) \
        else Collective.ALLREDUCE
    needs: dict[int, int] = {}
    for pos, block in enumerate(plan.blocks):
        if block.op is completing:
            for piece in block.pieces:
                needs[piece.tensor_id] = pos
    return needs


class _Forward:
    """One forward pass: the training thread's clock, its spans, and the released gathers."""

    def __init__(self, start: float, channel: Channel, gathers: list[int]) -> None:
        self.t = start
        self.channel = channel
        self.gathers = gathers
        self.released = 0
        self.events: list[SimEvent] = []

    def release_through(self, index: int) -> None:
        while self.released < min(index + 1, len(self.gathers)):
            self.channel.offer(self.gathers[self.released], self.t)
            self.released += 1

    def wait_until(self, at: float, name: str) -> None:
        if at > self.t:
            self.events.append(SimEvent("wait", name, self.t, at))
            self.t = at

    def busy(self, seconds: float, name: str) -> None:
        if seconds > 0:
            self.events.append(SimEvent("compute", name, self.t, self.t + seconds))
            self.t += seconds


def run_overlap(run: RunProfile, plan: Plan, blocks: BlockTimes, compute: ComputeTimes,
                iterations: int) -> tuple[list[float], list[SimEvent], Channel]:
    channel = Channel(plan, blocks.durations)
    needs = completing_blocks(plan)
    gathers = blocks.forward
    gather_index = {pos: i for i, pos in enumerate(gathers)}
    nbytes = {t.tensor_id: t.nbytes for t in run.tensors}
    all_bytes = max(run.total_bytes, 1)
    by_module: dict[str | None, list[int]] = {}
    for t in run.tensors:
        if t.tensor_id in needs:
            by_module.setdefault(t.module, []).append(t.tensor_id)
    last_ready = max(blocks.ready, default=0.0)
    rest = max(compute.before_first_ready_s - compute.forward_s, 0.0)
    starts = [0.0]
    events: list[SimEvent] = []
    for k in range(iterations):
        fwd = _Forward(starts[-1], channel, gathers)
        # The first overlapped iteration follows a synchronous step: nothing is pending.
        pending = set(needs) if k > 0 else set()
        if pending:
            fwd.release_through(0)  # step() releases the first all-gather
        for name, own in compute.modules:
            tids = [t for t in by_module.get(name, ()) if t in pending]
            if tids:
                need = max(needs[t] for t in tids)
                if need in gather_index:
                    fwd.release_through(gather_index[need] + 1)
                fwd.wait_until(channel.done_at(need), name or "(root)")
                fwd.busy(compute.step_s * sum(nbytes[t] for t in tids) / all_bytes, "update")
                pending.difference_update(tids)
            fwd.busy(own, name or "(root)")
        if k > 0:
            fwd.release_through(len(gathers))
            fwd.wait_until(channel.all_done(), "end of forward")
            fwd.busy(compute.step_s * sum(nbytes[t] for t in pending) / all_bytes, "update")
        fwd.busy(rest, "loss, backward start")
        first = fwd.t
        channel.reset()
        forward_stage = set(gathers)
        for pos in range(len(plan.blocks)):
            if pos not in forward_stage:
                channel.offer(pos, first + blocks.ready_after_first[pos])
        fwd.busy(last_ready, "backward")
        events = fwd.events
        starts.append(fwd.t)  # step() returns at once: the next iteration starts here
    return starts, events, channel
