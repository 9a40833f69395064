"""Shared planning steps: the atomic units every policy arranges, in ready order."""

from __future__ import annotations

from dataclasses import dataclass

from .types import Block, Collective, Piece, Profile, TensorSpec


@dataclass(frozen=True)
class Unit:
    """Tensors that must travel together: one tensor, or one dtype slice of a Horovod group."""

    specs: tuple[TensorSpec, ...]
    ready: float

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    @property
    def dtype(self) -> str:
        return self.specs[0].dtype

    @property
    def forward_index(self) -> int:
        return min(s.forward_index for s in self.specs)


def ready_time(spec: TensorSpec, profile: Profile) -> float:
    """Profiled ready time; without a profile every gradient counts as ready at once."""
    return profile.ready_times[spec.tensor_id] if profile.measured else 0.0


def units_in_ready_order(specs: list[TensorSpec], profile: Profile) -> list[Unit]:
    """Units sorted by ready time; ties (and an empty profile) fall back to reverse forward
    order, the order autograd usually produces gradients in."""
    grouped: dict[tuple[int, str], list[TensorSpec]] = {}
    units: list[Unit] = []
    for spec in specs:
        if spec.numel == 0:
            continue
        if spec.group is None:
            units.append(Unit((spec,), ready_time(spec, profile)))
        else:
            grouped.setdefault((spec.group, spec.dtype), []).append(spec)
    for members in grouped.values():
        ordered = tuple(sorted(members, key=lambda s: -s.forward_index))
        units.append(Unit(ordered, max(ready_time(s, profile) for s in members)))
    return sorted(units, key=lambda u: (u.ready, -u.forward_index))


def whole_pieces(specs: tuple[TensorSpec, ...] | list[TensorSpec]) -> tuple[Piece, ...]:
    return tuple(Piece(s.tensor_id, 0, s.numel) for s in specs)


def blocks_from_unit_lists(unit_lists: list[list[Unit]]) -> tuple[Block, ...]:
    """One block per list of units, numbered in plan order."""
    blocks = []
    for block_id, units in enumerate(unit_lists):
        specs = [s for u in units for s in u.specs]
        blocks.append(Block(block_id, whole_pieces(specs), units[0].dtype))
    return tuple(blocks)


def layerwise(specs: list[TensorSpec], profile: Profile) -> tuple[Block, ...]:
    """One collective per unit in ready order (WFBP): the profiling plan, and what every
    policy degenerates to when fusion is off."""
    return blocks_from_unit_lists([[u] for u in units_in_ready_order(specs, profile)])


def layerwise_decoupled(specs: list[TensorSpec], profile: Profile) -> tuple[Block, ...]:
    """The profiling plan when reduce-scatter and all-gather must be fitted too (`dear`, `auto`):
    every other unit is reduced as a reduce-scatter immediately followed by its all-gather,
    which together equal its all-reduce, so training is unchanged while the profiler times all
    three collectives on this transport (Gloo's own reduce-scatter costs about as much as an
    all-reduce, far from the textbook half; csrc/ring.h says what the engine runs instead)."""
    plain = layerwise(specs, profile)
    # Alternate by size, not by position: both fits need large and small samples (by position,
    # a CNN's two large classifier tensors both became pairs and all-reduce fitted beta = 0).
    by_size = sorted(range(len(plain)), key=lambda i: (-_block_numel(plain[i]), i))
    decoupled = set(by_size[1::2])
    if 0 in decoupled:  # the first block stays an all-reduce: Note [The block that opens the
        # backward]; its neighbour in size takes its place
        at = by_size.index(0)
        neighbour = by_size[at + 1] if at + 1 < len(by_size) else by_size[at - 1]
        decoupled = decoupled - {0} | {neighbour}
    blocks: list[Block] = []
    for i, block in enumerate(plain):
        block_id = len(blocks)
        if i not in decoupled:
            blocks.append(Block(block_id, block.pieces, block.dtype))
            continue
        blocks.append(Block(block_id, block.pieces, block.dtype, Collective.REDUCE_SCATTER))
        blocks.append(Block(block_id + 1, block.pieces, block.dtype, Collective.ALL_GATHER,
                            source=block_id))
    return tuple(blocks)


# Note [The block that opens the backward]
# The iteration's first block waits, on every rank but the last to get there, for the latest
# rank to start its backward, and its service time holds that wait. On 3 ranks sharing 2 cores
# the wait for the CNN's first block (a 48-byte bias) is far longer than on 2 ranks, and far
# longer than the block's transfer. Every all-reduce plan's own run charges that wait to an
# all-reduce (bytescheduler's first block, 40 bytes). Under dear the forward's all-gathers line
# the ranks up, and its first reduce-scatter waited much less. When the profiling steps opened
# with a reduce-scatter, that one sample held most of the reduce-scatter fit's time. The fit
# came out more than twice dear's own, and auto predicted dear well behind bytescheduler, where
# it measured ahead of it (the simulator-validation job of 2026-11-25, cnn-1gbit-3ranks).
# Re-fitted from those profiles with the wait moved to the all-reduce, dear was predicted ahead
# of bytescheduler too (figures: benchmarks/notes/README.md, 'The block that opens the
# backward').
# This mends the first block only. Any block that follows a large block of another collective
# holds a wait of the same kind: a large collective ends at different times on the ranks, and
# the next block, on the rank that finished first, waits for the others to launch it (2 ranks:
# the blocks after the 4 MB pair and the 8 MB all-reduce of the CNN). The general mend belongs
# to the fit (runtime/engine/collective_fit.py), not to this plan.


def _block_numel(block: Block) -> int:
    return sum(p.numel for p in block.pieces)
