"""What the engine copies per plan (commsched/plan/copies.py, mirroring csrc/fusion_buffer.cpp)
and `auto`'s tie-break by it (Note [Fewer copies break a tie] in
runtime/planning/auto/trials.py)."""

from __future__ import annotations

from commsched.config import Policy
from commsched.plan import Block, Collective, Piece, Plan, TensorSpec
from commsched.plan.copies import copied_bytes
from commsched.runtime.planning.auto.trials import TIE_WINDOW, knob_twin, prefer_fewer_copies
from commsched.sim import Ranked

AR, RS, AG = Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
SPECS = [TensorSpec(0, "w", 6, "float32", 4, 0), TensorSpec(1, "b", 3, "float32", 4, 1),
         TensorSpec(2, "h", 4, "float64", 8, 2)]


def block(block_id: int, op: Collective, pieces: list[tuple[int, int, int]],
          dtype: str = "float32", source: int | None = None) -> Block:
    return Block(block_id, tuple(Piece(*p) for p in pieces), dtype, op, source=source)


def copies(*blocks: Block, world: int = 2) -> int:
    return copied_bytes(Plan("test", blocks), SPECS, world)


def test_a_whole_gradient_or_a_partition_is_reduced_in_place() -> None:
    assert copies(block(0, AR, [(0, 0, 6)])) == 0
    assert copies(block(0, AR, [(0, 2, 4)]), block(1, AR, [(0, 0, 2)])) == 0


def test_a_fused_all_reduce_copies_in_and_out() -> None:
    assert copies(block(0, AR, [(0, 0, 6), (1, 0, 3)])) == 2 * 9 * 4


def test_another_dtype_on_the_block_copies() -> None:
    assert copies(block(0, AR, [(2, 0, 4)], dtype="float32")) == 2 * 4 * 8


def test_a_pair_copies_where_fused_or_padded_only() -> None:
    whole = [block(0, RS, [(0, 0, 6)]), block(1, AG, [(0, 0, 6)], source=0)]
    assert copies(*whole, world=2) == 0
    assert copies(*whole, world=4) == 2 * 6 * 4  # 6 elements padded to 8: packed, gathered apart
    fused = [block(0, RS, [(0, 0, 6), (1, 0, 3)]), block(1, AG, [(0, 0, 6), (1, 0, 3)], source=0)]
    assert copies(*fused, world=3) == 2 * 9 * 4


def test_a_standalone_all_gather_always_gathers_into_a_new_buffer() -> None:
    assert copies(block(0, AG, [(0, 0, 6)])) == 6 * 4
    assert copies(block(0, AG, [(0, 0, 6), (1, 0, 3)])) == 2 * 9 * 4


def candidate(policy: str, seconds: float, fused: bool, knob: int) -> Ranked:
    blocks = ((block(0, AR, [(0, 0, 6), (1, 0, 3)]),) if fused
              else (block(0, AR, [(0, 0, 6)]), block(1, AR, [(1, 0, 3)])))
    plan = Plan(policy, blocks)
    return Ranked(Policy(policy), {"fusion_threshold": knob}, plan, seconds)


def by_copies(plan: Plan) -> int:
    return copied_bytes(plan, SPECS, 2)


def test_the_setting_that_copies_least_leads_a_tie_of_its_policy() -> None:
    fused, apart = candidate("dear", 1.0, True, 64), candidate("dear", 1.01, False, 4)
    other = candidate("prophet", 1.005, False, 8)
    order = prefer_fewer_copies([fused, other, apart], by_copies)
    assert order == [apart, fused, other]
    # The displaced leader is the knob setting the trials measure beside it.
    assert [order[i] for i in knob_twin(order, [0], [order[0]])] == [fused]


def test_no_tie_no_move() -> None:
    fused = candidate("dear", 1.0, True, 64)
    apart = candidate("dear", 1.0 + 1.01 * TIE_WINDOW, False, 4)
    assert prefer_fewer_copies([fused, apart], by_copies) == [fused, apart]
    # Another policy's plan is not a knob setting of the leader's.
    other = candidate("prophet", 1.001, False, 8)
    assert prefer_fewer_copies([fused, other], by_copies) == [fused, other]
    # Equal copies keep the simulator's order.
    twin = candidate("dear", 1.001, True, 16)
    assert prefer_fewer_copies([fused, twin], by_copies) == [fused, twin]
