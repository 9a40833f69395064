"""What the engine copies to run a plan: the bytes packed into fusion buffers and unpacked out
of them per iteration, where a block cannot be reduced in the gradient's own memory. The rules
mirror csrc/fusion_buffer.cpp (Note [A partition is reduced in place], Note [An all-gather
lands in the gradient it came from]); the simulator does not charge these copies, `auto`
breaks its ties by them (Note [Fewer copies break a tie] in runtime/planning/auto/trials.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .types import Block, Collective, Plan, TensorSpec


def _in_place(block: Block, specs: Mapping[int, TensorSpec]) -> bool:
    """One piece of a gradient of the block's dtype: a whole tensor or a run of one."""
    return len(block.pieces) == 1 and specs[block.pieces[0].tensor_id].dtype == block.dtype


def block_copied_bytes(block: Block, specs: Mapping[int, TensorSpec], world_size: int) -> int:
    """Bytes the engine copies for one block: into its buffer before the collective and out of
    it after, each counted once per byte moved. `specs`: the tensors by id."""
    numel = sum(piece.numel for piece in block.pieces)
    nbytes = sum(piece.numel * specs[piece.tensor_id].element_size for piece in block.pieces)
    in_place = _in_place(block, specs)
    if block.op is Collective.ALLREDUCE:
        return 0 if in_place else 2 * nbytes
    unpadded = numel % world_size == 0  # a reduce-scatter pads to a multiple of the ranks
    if block.op is Collective.REDUCE_SCATTER:
        return 0 if in_place and unpadded else nbytes
    if block.source is not None:  # a pair's all-gather: packs nothing, lands where it can
        return 0 if in_place and unpadded else nbytes
    # A standalone all-gather (K-FAC's) packs unless in place and gathers into a new buffer.
    return (0 if in_place and unpadded else nbytes) + nbytes


def copied_bytes(plan: Plan, specs: Sequence[TensorSpec], world_size: int) -> int:
    """Bytes the engine copies per iteration to run `plan` on `world_size` ranks.

    Args:
        plan: the plan.
        specs: the tensors it reduces.
        world_size: the ranks (a reduce-scatter pads its block to a multiple of them).

    Returns:
        The bytes packed into fusion buffers plus those unpacked out of them.
    """
    by_id = {spec.tensor_id: spec for spec in specs}
    return sum(block_copied_bytes(block, by_id, world_size) for block in plan.blocks)
