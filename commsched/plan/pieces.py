"""The pieces of an update group's update: where a group of partitioned tensors is stepped piece
by piece as its blocks land (Note [A large group is updated piece by piece] in
commsched/runtime/modes/overlap/piecewise.py). Pure: the runtime's overlap layout and the simulator
cut a
group the same way."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from .types import Collective, Plan

# The smallest piece, and so how many calls a group makes: a call costs tens of microseconds
# of Python, a piece of 16 MiB some milliseconds of memory traffic.
PIECE_BYTES = 16 << 20


@dataclass(frozen=True)
class UpdatePiece:
    """Part of a group's update: the plan positions of the blocks that complete it, in order,
    and its flat element ranges as (slot, start, stop)."""

    waits: tuple[int, ...]
    ranges: tuple[tuple[int, int, int], ...]


def group_pieces(plan: Plan, tensor_ids: Sequence[int], slot_of: dict[int, int],
                 sizes: Sequence[tuple[int, int]]) -> tuple[UpdatePiece, ...]:
    """The pieces of one group's update, in plan order, or () when it is stepped whole.

    Args:
        plan: the overlap plan.
        tensor_ids: the group's tensors.
        slot_of: tensor id -> the slot a piece's ranges name, for the tensors some block
            completes (the others are no part of the group's update).
        sizes: by tensor id, (numel, element size).

    Returns:
        Pieces of at least PIECE_BYTES (the last may be smaller), two or more; () where a
        tensor of the group travels otherwise than by all-reduce, or the group is too small.
    """
    wanted = {t for t in tensor_ids if t in slot_of}
    found: list[tuple[int, int, int, int]] = []  # (position, tensor id, offset, numel)
    for position, block in enumerate(plan.blocks):
        mine = [p for p in block.pieces if p.tensor_id in wanted]
        if mine and block.op is not Collective.ALLREDUCE:
            return ()
        found += [(position, p.tensor_id, p.offset, p.numel) for p in mine]
    covered = collections.Counter[int]()
    for _, tid, _, numel in found:
        covered[tid] += numel
    if any(covered[t] != sizes[t][0] for t in wanted):
        return ()
    pieces: list[UpdatePiece] = []
    waits: list[int] = []
    ranges: list[tuple[int, int, int]] = []
    nbytes = 0
    for position, tid, offset, numel in found:
        if not waits or waits[-1] != position:
            waits.append(position)
        ranges.append((slot_of[tid], offset, offset + numel))
        nbytes += numel * sizes[tid][1]
        if nbytes >= PIECE_BYTES:
            pieces.append(UpdatePiece(tuple(waits), _merged(ranges)))
            waits, ranges, nbytes = [], [], 0
    if ranges:
        pieces.append(UpdatePiece(tuple(waits), _merged(ranges)))
    return tuple(pieces) if len(pieces) >= 2 else ()


def _merged(ranges: list[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """Adjacent ranges of one slot as one (a tensor's consecutive partitions)."""
    out: list[tuple[int, int, int]] = []
    for slot, start, stop in sorted(ranges):
        if out and out[-1][0] == slot and out[-1][2] == start:
            out[-1] = (slot, out[-1][1], stop)
        else:
            out.append((slot, start, stop))
    return tuple(out)
