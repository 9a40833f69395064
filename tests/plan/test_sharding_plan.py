"""plan/sharding.py without processes: the sharded plan's blocks, and the slices each rank owns
(every element of every block owned by exactly one rank, the padding by none)."""

from __future__ import annotations

import pytest

from commsched.plan import Block, Collective, Plan, Stage
from commsched.plan.sharding import gather_positions, owned_segments, shard_layout, sharded_plan
from commsched.plan.types import Piece


def _plan() -> Plan:
    return Plan("horovod", (
        Block(0, (Piece(3, 0, 5), Piece(1, 0, 7)), "float32"),
        Block(1, (Piece(0, 0, 4), Piece(2, 2, 3)), "float32"),
        Block(2, (Piece(4, 0, 1),), "float32"),
    ))


def test_sharded_plan_keeps_positions_and_appends_held_gathers() -> None:
    plan = sharded_plan(_plan())
    reduces, gathers = plan.blocks[:3], plan.blocks[3:]
    assert [b.op for b in reduces] == [Collective.REDUCE_SCATTER] * 3
    assert [b.pieces for b in reduces] == [b.pieces for b in _plan().blocks]
    assert [b.pieces for b in gathers] == [b.pieces for b in reduces]
    assert all(b.op is Collective.ALL_GATHER and b.stage is Stage.FORWARD and b.source is None
               for b in gathers)
    assert all(b.stage is Stage.BACKWARD for b in reduces)
    assert len({b.block_id for b in plan.blocks}) == 6
    assert gather_positions(_plan()) == {0: 3, 1: 4, 2: 5}


def test_a_decoupled_plan_keeps_its_places() -> None:
    dear = Plan("dear", (Block(0, (Piece(0, 0, 4),), "float32", Collective.REDUCE_SCATTER),
                         Block(1, (Piece(1, 0, 6),), "float32", Collective.REDUCE_SCATTER),
                         Block(2, (Piece(1, 0, 6),), "float32", Collective.ALL_GATHER,
                               Stage.FORWARD, source=1),
                         Block(3, (Piece(0, 0, 4),), "float32", Collective.ALL_GATHER,
                               Stage.FORWARD, source=0)))
    plan = sharded_plan(dear)
    assert [b.op for b in plan.blocks] == [b.op for b in dear.blocks]
    assert [b.pieces for b in plan.blocks] == [b.pieces for b in dear.blocks]
    assert all(b.source is None for b in plan.blocks)
    assert gather_positions(dear) == {0: 3, 1: 2}
    assert [(b.reduce_position, b.gather_position) for b in shard_layout(dear, 2, 0)] == \
        [(0, 3), (1, 2)]


def test_a_compressed_plan_is_refused() -> None:
    topk = Plan("horovod", (Block(0, (Piece(0, 0, 4),), "float32", Collective.ALL_GATHER),))
    with pytest.raises(ValueError, match="standalone all-gather"):
        sharded_plan(topk)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 13, 20])
def test_every_element_has_one_owner(world: int) -> None:
    plan = sharded_plan(_plan())
    owners: dict[tuple[int, int], int] = {}
    for rank in range(world):
        for block in shard_layout(_plan(), world, rank):
            assert plan.blocks[block.reduce_position].op is Collective.REDUCE_SCATTER
            assert plan.blocks[block.gather_position].pieces == \
                plan.blocks[block.reduce_position].pieces
            for segment in block.segments:
                assert segment.shard_offset >= 0
                assert segment.shard_offset + segment.numel <= block.shard_numel
                for element in range(segment.offset, segment.offset + segment.numel):
                    key = (segment.tensor_id, element)
                    assert key not in owners, (key, owners.get(key), rank)
                    owners[key] = rank
    expected = {(p.tensor_id, p.offset + i) for b in _plan().blocks for p in b.pieces
                for i in range(p.numel)}
    assert set(owners) == expected


def test_a_slice_follows_the_packing_order() -> None:
    # Block 0 packs tensor 3's 5 elements, then tensor 1's 7: 12 elements, 2 ranks of 6.
    block = _plan().blocks[0]
    assert [(s.tensor_id, s.offset, s.numel, s.shard_offset)
            for s in owned_segments(block, 2, 1)] == [(1, 1, 6, 0)]
    assert [(s.tensor_id, s.offset, s.numel, s.shard_offset)
            for s in owned_segments(block, 2, 0)] == [(3, 0, 5, 0), (1, 0, 1, 5)]
    # 1 element on 3 ranks: slices of 1, the last two all padding.
    assert owned_segments(_plan().blocks[2], 3, 2) == ()
