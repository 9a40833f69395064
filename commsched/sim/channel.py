"""The serial communication channel of one rank, and the per-block numbers a simulation needs."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Collective, Plan, Stage
from .network import BulkRateNetwork, Network
from .profile import RunProfile, ready_offsets

OP_LABEL = {Collective.ALLREDUCE: "allreduce", Collective.REDUCE_SCATTER: "reduce_scatter",
            Collective.ALL_GATHER: "all_gather"}


@dataclass(frozen=True)
class SimEvent:
    """A span on one lane: "compute" (training thread busy), "network" (a block on the wire),
    "wait" (training thread blocked on communication). Times are seconds from the start of the
    reported iteration (the end of the previous step()); a block of the previous iteration that
    was already on the wire then starts before 0."""

    lane: str
    name: str
    start_s: float
    end_s: float
    block_id: int | None = None
    nbytes: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class BlockTimes:
    """Per tensor and per block (plan positions), what does not change between iterations."""

    ready: list[float]  # per tensor, seconds from the iteration's first gradient
    nbytes: list[int]
    ready_after_first: list[float]  # per block: when its last piece is ready
    durations: list[float]
    forward: list[int]  # positions of forward-stage blocks (launched when released)
    notes: list[str]


def block_times(run: RunProfile, plan: Plan, net: Network) -> BlockTimes:
    ready, notes = ready_offsets(run)
    sizes = [t.element_size for t in run.tensors]
    nbytes, block_ready, durations, forward = [], [], [], []
    for pos, block in enumerate(plan.blocks):
        for piece in block.pieces:
            if not 0 <= piece.tensor_id < len(sizes):
                raise ValueError(f"plan {plan.policy}: block {block.block_id} holds tensor "
                                 f"{piece.tensor_id}, which the profile does not have")
        size = sum(p.numel * sizes[p.tensor_id] for p in block.pieces)
        nbytes.append(size)
        block_ready.append(max((ready[p.tensor_id] for p in block.pieces), default=0.0))
        durations.append(net.time(block.op, size))
        if block.stage is Stage.FORWARD:
            forward.append(pos)
    return BlockTimes(ready, nbytes, block_ready, durations, forward, notes)


def wire_bytes(plan: Plan, blocks: BlockTimes, net: Network) -> float:
    """Bytes one rank sends for the plan's blocks of one iteration."""
    return sum(net.wire_bytes(block.op, size)
               for block, size in zip(plan.blocks, blocks.nbytes, strict=True))


class Channel:
    """Runs one iteration's blocks strictly in plan order: a block starts at the latest of its
    launch time (all pieces ready, or released for a forward-stage block), the previous block's
    end, and, for an all-gather, its reduce-scatter's end. The channel's clock carries over
    between iterations, the launch times do not."""

    def __init__(self, plan: Plan, durations: list[float]) -> None:
        self.blocks = plan.blocks
        self.durations = durations
        self.position_of = {b.block_id: i for i, b in enumerate(plan.blocks)}
        self.free_at = 0.0
        self.spans: list[tuple[int, float, float]] = []  # (position, start, end), every iteration
        self.reset()

    def reset(self) -> None:
        """Next iteration: no block offered, none scheduled."""
        self.launch: list[float | None] = [None] * len(self.blocks)
        self.end: list[float | None] = [None] * len(self.blocks)
        self.next = 0

    def offer(self, position: int, at: float) -> None:
        """Block `position` may launch from time `at` (kept if it was offered earlier)."""
        if self.launch[position] is None:
            self.launch[position] = at
        while self.next < len(self.blocks) and self.launch[self.next] is not None:
            self._schedule(self.next)
            self.next += 1

    def _schedule(self, pos: int) -> None:
        launch = self.launch[pos]
        assert launch is not None
        start = max(launch, self.free_at)
        block = self.blocks[pos]
        if block.source is not None:
            source = self.position_of.get(block.source)
            source_end = self.end[source] if source is not None else None
            if source_end is None:
                raise ValueError(f"all-gather block {block.block_id} must come after its "
                                 f"reduce-scatter block {block.source} in plan order")
            start = max(start, source_end)
        self.end[pos] = self.free_at = start + self.durations[pos]
        self.spans.append((pos, start, self.free_at))

    def done_at(self, position: int) -> float:
        end = self.end[position]
        if end is None:
            raise AssertionError(f"block at position {position} was waited for but never launched")
        return end

    def all_done(self) -> float:
        """When every block of the iteration is done (all must have been offered)."""
        return max((self.done_at(p) for p in range(len(self.blocks))), default=self.free_at)


def block_positions(plan: Plan, tensor_ids: frozenset[int]) -> set[int]:
    return {pos for pos, b in enumerate(plan.blocks)
            if any(p.tensor_id in tensor_ids for p in b.pieces)}


def at_bulk_rate(run: RunProfile, plan: Plan, net: Network,
                 seconds_per_wire_byte: float) -> Network:
    """`net`, its collectives slowed by the one factor that makes the plan's blocks of one
    iteration take their wire bytes at the link's bulk rate where they would take less (Note
    [No faster than the link's bulk rate] in network.py); `net` itself where they do not."""
    blocks = block_times(run, plan, net)
    busy = sum(blocks.durations)
    factor = seconds_per_wire_byte * wire_bytes(plan, blocks, net) / busy if busy > 0 else 1.0
    return BulkRateNetwork(net, factor) if factor > 1.0 else net
