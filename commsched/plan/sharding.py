"""Sharded optimizer state (ZeRO stage 1 on DeAR's decoupling): the plan the engine runs, and
which elements of which parameters each rank updates.

Note [Flat slices, not whole parameters]
A sharded run reduce-scatters every block of the plan and all-gathers it back after the update.
A reduce-scatter hands rank r the r-th of N equal slices of the block's packed buffer (padded to
a multiple of N), already summed: stepping exactly that slice, and all-gathering the updated
parameters in place of the averaged gradients, costs the traffic of one all-reduce. Owning whole
parameters instead would need a reduce to each parameter's owner (a collective neither Gloo's
ring nor the engine's runs at the all-reduce's cost) or a second exchange after the
reduce-scatter. So each rank owns the flat slice the reduce-scatter leaves it, for every block:
balanced by bytes by construction (per block, at most N - 1 elements of padding, all on the last
ranks), identical on every rank because the plan is (its fingerprint is compared before it is
installed), and no table of owners to agree on. The price: a slice cuts parameters, so only an
optimizer that updates each element from that element's gradient and state can step it (SGD,
Adam, AdamW, ... ; runtime/modes/shard_state.py keeps the list), and the slices move when the plan
does
(runtime/modes/shard_state.py re-shards the state then).
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import Block, Collective, Plan, Stage

# The policies whose plans run sharded: all-reduces (each becomes a reduce-scatter, and an
# all-gather released at step()) or DeAR's pairs (its all-gather still released in the next
# forward pass). ByteScheduler's and Prophet's partitions, whose all-reduces run on across the
# next forward pass, are not sharded yet. `auto` under shard_optimizer chooses among these.
SHARDABLE_POLICIES = ("horovod", "ddp", "mgwfbp", "dear")


@dataclass(frozen=True)
class Segment:
    """A run of one parameter's elements that a rank owns: elements [offset, offset + numel) of
    the flattened tensor `tensor_id`, found at `shard_offset` in the rank's slice of its block."""

    tensor_id: int
    offset: int
    numel: int
    shard_offset: int


@dataclass(frozen=True)
class BlockShard:
    """One reduce-scatter of a sharded plan and what this rank owns of it.

    `reduce_position` and `gather_position` are plan positions (the engine's indices);
    `shard_numel` is the length of every rank's slice, padding included."""

    reduce_position: int
    gather_position: int
    shard_numel: int
    segments: tuple[Segment, ...]


def sharded_plan(plan: Plan) -> Plan:
    """The plan a sharded run installs: every block reduce-scattered in backward, and each
    all-gather held until the caller releases it (after the update wrote the slice's parameters
    where the gradient was), standalone: each rank sends the slice it owns, unscaled.

    A block keeps its position, so that the plan's update groups and waits still hold: an
    all-reduce becomes a reduce-scatter and its all-gather is appended (released at step()); a
    DeAR pair keeps both places (its all-gather still released in the next forward pass).

    Args:
        plan: a plan of all-reduces, or of reduce-scatters each with its all-gather (DeAR's).

    Returns:
        The sharded plan; appended all-gathers follow their reduce-scatters' order.

    Raises:
        ValueError: the plan holds a standalone all-gather (a lossy compressor's), which has no
            gradient slice to update.
    """
    blocks: list[Block] = []
    appended: list[Block] = []
    for block in plan.blocks:
        if block.op is Collective.ALL_GATHER:
            if block.source is None:
                raise ValueError("commsched: shard_optimizer cannot shard a compressed plan "
                                 f"('{plan.policy}' block {block.block_id} is a standalone "
                                 "all-gather)")
            blocks.append(Block(block.block_id, block.pieces, block.dtype,
                                Collective.ALL_GATHER, Stage.FORWARD))
            continue
        blocks.append(Block(block.block_id, block.pieces, block.dtype,
                            Collective.REDUCE_SCATTER))
        if block.op is Collective.ALLREDUCE:
            appended.append(block)
    next_id = max((b.block_id for b in plan.blocks), default=-1) + 1
    gathers = [Block(next_id + i, block.pieces, block.dtype, Collective.ALL_GATHER,
                     Stage.FORWARD) for i, block in enumerate(appended)]
    return Plan(plan.policy, tuple(blocks + gathers), plan.update_groups)


def gather_positions(plan: Plan) -> dict[int, int]:
    """For `plan` (the unsharded one), where its sharded plan all-gathers each reduced block:
    {plan position of the block: plan position of its all-gather}."""
    position = {b.block_id: i for i, b in enumerate(plan.blocks)}
    out: dict[int, int] = {}
    appended = len(plan.blocks)
    for i, block in enumerate(plan.blocks):
        if block.op is Collective.ALLREDUCE:
            out[i] = appended
            appended += 1
        elif block.op is Collective.ALL_GATHER and block.source is not None:
            out[position[block.source]] = i
    return out


def owned_segments(block: Block, world: int, rank: int) -> tuple[Segment, ...]:
    """The elements of `block` that `rank` owns: its slice of the packed, padded block.

    Args:
        block: a block of the plan (its pieces in packing order).
        world: the number of ranks.
        rank: the owner asked about.

    Returns:
        The segments in slice order; empty where the slice is all padding.
    """
    total = sum(piece.numel for piece in block.pieces)
    shard = -(-total // world)
    lo, hi = rank * shard, (rank + 1) * shard
    segments = []
    position = 0
    for piece in block.pieces:
        start, end = max(lo, position), min(hi, position + piece.numel)
        if start < end:
            segments.append(Segment(piece.tensor_id, piece.offset + start - position,
                                    end - start, start - lo))
        position += piece.numel
    return tuple(segments)


def shard_layout(plan: Plan, world: int, rank: int) -> tuple[BlockShard, ...]:
    """What `rank` owns when `plan` runs sharded (sharded_plan(plan)).

    Args:
        plan: the unsharded plan.
        world: the number of ranks.
        rank: this rank.

    Returns:
        One BlockShard per reduced block, in plan order.
    """
    layout = []
    for position, gather in sorted(gather_positions(plan).items()):
        block = plan.blocks[position]
        total = sum(piece.numel for piece in block.pieces)
        layout.append(BlockShard(position, gather, -(-total // world),
                                 owned_segments(block, world, rank)))
    return tuple(layout)
