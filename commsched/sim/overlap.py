"""Cross-iteration overlap (bytescheduler, prophet, dear), as
commsched/runtime/modes/overlap/runner.py runs
it.

step() launches what is left and returns at once. In the next forward pass (modules in profiled
forward order, each taking its own forward time), the pre-hook of the module that starts an
update group (plan.update_groups; without them, one group per module that first uses some
parameter):
  1. for DeAR plans releases the all-gathers up to one past the one the group needs (step()
     released the first), one block of look-ahead;
  2. waits until the group's last block (`wait_for`) is done;
  3. applies the group's update: one optimizer call, fixed + per-byte cost (ComputeTimes.update);
     a large group of all-reduced partitions in pieces instead, each after its own blocks
     (plan/pieces.py; Note [A large group is updated piece by piece] in
     runtime/modes/overlap/piecewise.py).
At the end of the forward (the root module's hook) every block is waited for and the updates of
tensors no module claimed are applied. Then loss and the start of backward take what is left of
before_first_ready_s after the forward, and the gradients follow at their ready times; the
backward-stage blocks of this iteration run while the next forward runs.

Sharded (shard_optimizer, sim/sharded.py): step() updates this rank's slice of each block as its
reduce-scatter completes, and the next forward's group updates are copies of the gathered
parameters, not charged.

`with_update_groups` chooses a plan's groups (plan/update_groups.py) from the block completion
times this simulation predicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..plan import Plan, UpdateGroup
from ..plan.pieces import UpdatePiece, group_pieces
from ..plan.update_groups import per_module_groups, plan_update_groups
from .channel import BlockTimes, Channel, SimEvent, block_positions, block_times
from .network import Network
from .profile import RunProfile
from .sharded import ShardStep
from .timing import CompressorCompute, ComputeTimes, compute_times


def completing_blocks(plan: Plan, carriers: Mapping[int, Sequence[int]] | None = None
                      ) -> dict[int, int]:
    """Tensor id -> plan position of the block whose completion makes its update possible: the
    last block holding a piece of it (DeAR: its all-gather). A compressed gradient is in no
    block: it waits for the last block of the wire tensors it is rebuilt from (`carriers`,
    WireLayout.carriers), and the wire tensors themselves are no parameters to update."""
    last: dict[int, int] = {}
    for pos, block in enumerate(plan.blocks):
        for piece in block.pieces:
            last[piece.tensor_id] = pos
    if not carriers:
        return last
    wires = {w for ws in carriers.values() for w in ws}
    missing = sorted(wires - set(last))
    if missing:
        raise AssertionError(f"commsched: plan {plan.policy} carries no block of wire tensors "
                             f"{missing}")
    needs = {t: pos for t, pos in last.items() if t not in wires}
    needs.update({grad: max(last[w] for w in ws) for grad, ws in carriers.items()})
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


def groups_of(run: RunProfile, plan: Plan, needs: dict[int, int]) -> tuple[UpdateGroup, ...]:
    """The plan's update groups, or one per first-user module when it has none."""
    if plan.update_groups:
        return plan.update_groups
    first_user = {t.tensor_id: t.module for t in run.tensors if t.module is not None}
    return per_module_groups([m.name for m in run.modules], first_user, needs)


def run_overlap(run: RunProfile, plan: Plan, blocks: BlockTimes, compute: ComputeTimes,
                iterations: int, compressor: CompressorCompute | None = None,
                shard_steps: Sequence[ShardStep] = ()
                ) -> tuple[list[float], list[SimEvent], Channel]:
    """`plan` as it runs (under sharding, the sharded plan, with its `shard_steps`)."""
    channel = Channel(plan, blocks.durations)
    needs = completing_blocks(plan, compressor.carriers if compressor else None)
    gathers = blocks.forward
    gather_index = {pos: i for i, pos in enumerate(gathers)}
    nbytes = {t.tensor_id: t.nbytes for t in run.tensors}
    starting: dict[str, list[UpdateGroup]] = {}
    names = [name for name, _ in compute.modules]
    for group in groups_of(run, plan, needs):
        # A module the profile does not list: the runtime applies its group at the root.
        start = group.module if group.module in names or not names else names[0]
        starting.setdefault(start, []).append(group)
    grouped = {t for groups in starting.values() for g in groups for t in g.tensor_ids}
    last_ready = max(blocks.ready, default=0.0)
    rest = max(compute.before_first_ready_s - compute.forward_s, 0.0)
    after = block_positions(plan, compressor.after) if compressor else set()
    waited = block_positions(plan, compressor.waited_for) if compressor else set()
    # DeAR: step() releases the all-gathers up to the last one of the first round it waits for.
    last_gather = max((gather_index[p] for p in waited if p in gather_index), default=-1)
    released_at_step = gathers[:last_gather + 1]

    def update(nbytes: int) -> float:  # a sharded group's update is a copy
        return 0.0 if shard_steps else compute.update.time(nbytes)

    cut = _pieces(run, plan, needs, starting) if not (gathers or compressor or shard_steps) \
        else {}

    starts = [0.0]
    events: list[SimEvent] = []
    for k in range(iterations):
        fwd = _Forward(starts[-1], channel, gathers)
        # The first overlapped iteration follows a synchronous step: nothing is pending.
        overlapped = k > 0
        if overlapped:
            fwd.release_through(0)  # step() releases the first all-gather
        for name, own in compute.modules:
            for group in starting.get(name, ()) if overlapped else ():
                if group.wait_for in gather_index:
                    fwd.release_through(gather_index[group.wait_for] + 1)
                for waits, piece_bytes in cut.get(group.tensor_ids) or \
                        [((group.wait_for,), sum(nbytes[t] for t in group.tensor_ids))]:
                    fwd.wait_until(max(map(channel.done_at, waits)), name or "(root)")
                    fwd.busy(update(piece_bytes), "update")
            fwd.busy(own, name or "(root)")
        if overlapped:
            fwd.release_through(len(gathers))
            fwd.wait_until(channel.all_done(), "end of forward")
            left = [t for t in needs if t not in grouped]
            if left:
                fwd.busy(update(sum(nbytes[t] for t in left)), "update")
        fwd.busy(rest, "loss, backward start")
        first = fwd.t
        channel.reset()
        forward_stage = set(gathers)
        for pos in range(len(plan.blocks)):
            if pos not in forward_stage and pos not in after:
                channel.offer(pos, first + blocks.ready_after_first[pos])
        fwd.busy(last_ready, "backward")
        if compressor is not None:
            _second_round(fwd, compressor.seconds, released_at_step, waited, after)
        for step in shard_steps:  # step() updates the slices before releasing any all-gather
            fwd.wait_until(channel.done_at(step.reduce_position), "step")
            fwd.busy(step.update_s, "update")
        events = fwd.events
        starts.append(fwd.t)  # step() returns at once: the next iteration starts here
    return starts, events, channel


def _second_round(fwd: _Forward, seconds: float, released: list[int], waited: set[int],
                  after: set[int]) -> None:
    """step() under a compressor (Note [Compression under an overlap plan] in
    runtime/compression/gradients.py): DeAR's all-gathers of the first round released, its blocks
    waited
    for, the compressor's time (all of it, decompression included: Note [Simulated compression
    compute]), then the second round launched; the next forward waits for it per group."""
    for pos in released:
        fwd.channel.offer(pos, fwd.t)  # the channel was reset since the forward released any
    if waited:
        fwd.wait_until(max(fwd.channel.done_at(p) for p in waited), "step")
    fwd.busy(seconds, "compress")
    for pos in sorted(after):
        fwd.channel.offer(pos, fwd.t)


def _pieces(run: RunProfile, plan: Plan, needs: Mapping[int, int],
            starting: Mapping[str, list[UpdateGroup]]
            ) -> dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]]:
    """Per group cut in pieces (by its tensor ids): each piece's blocks and bytes."""
    sizes = {t.tensor_id: (t.numel, t.element_size) for t in run.tensors}
    by_id = [sizes.get(t, (0, 0)) for t in range(max(sizes, default=-1) + 1)]
    identity = {t: t for t in needs}
    cut = {}
    for groups in starting.values():
        for group in groups:
            pieces = group_pieces(plan, group.tensor_ids, identity, by_id)
            if pieces:
                cut[group.tensor_ids] = [(p.waits, _bytes(p, by_id)) for p in pieces]
    return cut


def _bytes(piece: UpdatePiece, sizes: Sequence[tuple[int, int]]) -> int:
    return sum((stop - start) * sizes[t][1] for t, start, stop in piece.ranges)


def with_update_groups(run: RunProfile, plan: Plan, net: Network,
                       compressor: CompressorCompute | None = None) -> Plan:
    """`plan` with the update groups that the profile says are fastest (see
    plan/update_groups.py): block completion times from a simulation of the plan as it is
    (its own groups, or one per module), the cost of an optimizer call from the profile.
    Without module information (no model=) the plan is returned as it is. Under a lossy
    compressor `run` carries its wire tensors (sim/compressed.py) and `compressor` says which."""
    if not run.has_module_info or not plan.blocks:
        return plan
    blocks = block_times(run, plan, net)
    compute = compute_times(run, with_modules=True)
    starts, _, channel = run_overlap(run, plan, blocks, compute, 3, compressor)
    forward_start = starts[-1]
    for pos in blocks.forward:  # the next forward's all-gathers, released as early as can be
        channel.offer(pos, forward_start)
    needs = completing_blocks(plan, compressor.carriers if compressor else None)
    done_at = {t: max(channel.done_at(pos) - forward_start, 0.0) for t, pos in needs.items()}
    first_user = {t.tensor_id: t.module for t in run.tensors if t.module is not None}
    groups = plan_update_groups(compute.modules, first_user, needs, done_at,
                                {t.tensor_id: t.nbytes for t in run.tensors}, compute.update)
    return dataclasses.replace(plan, update_groups=groups)
