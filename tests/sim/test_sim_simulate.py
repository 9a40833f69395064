"""Simulated iterations on hand-made profiles and plans, with answers worked out on paper.

Network in every case: 2 workers, ring, alpha = 1 ms, 100 kB/s (beta = 10 us per byte), so
    all-reduce(n) = 2 ms + n * 10 us,   reduce-scatter(n) = all-gather(n) = 1 ms + n * 5 us.
"""

from __future__ import annotations

import pytest

from commsched.plan import Block, Collective, Piece, Plan, Stage, pieces
from commsched.sim import LinkNetwork, Mode, RunProfile, profile_from_document, simulate
from commsched.sim.simulator import SimResult

NET = LinkNetwork(2, 1e5, 1e-3)
RS, AG = Collective.REDUCE_SCATTER, Collective.ALL_GATHER


def run_of(tensors: list[tuple[str, int, float, str | None]], modules: list[tuple[str, float]],
           before: float | None, step: float | None) -> RunProfile:
    """tensors: (name, bytes, ready_time_s, module); modules: (name, self_time_s)."""
    doc = {"schema_version": 2, "world_size": 2,
           "compute": {k: v for k, v in (("before_first_ready_s", before), ("step_s", step))
                       if v is not None},
           "tensors": [{"id": i, "name": n, "numel": b // 4, "dtype": "float32",
                        "forward_index": i, "ready_time_s": r, "module": m}
                       for i, (n, b, r, m) in enumerate(tensors)],
           "modules": [{"name": n, "forward_order": i, "forward_time_s": s, "self_time_s": s}
                       for i, (n, s) in enumerate(modules)]}
    return profile_from_document(doc)


def allreduce_plan(*groups: list[int], sizes: dict[int, int]) -> Plan:
    return Plan("test", tuple(Block(i, tuple(Piece(t, 0, sizes[t] // 4) for t in g), "float32")
                              for i, g in enumerate(groups)))


def spans(result: SimResult, lane: str) -> list[tuple[str, float, float]]:
    return [(e.name, round(e.start_s, 9), round(e.end_s, 9))
            for e in result.events if e.lane == lane]


# Two tensors: t0 (1000 B, ready 10 ms after the first gradient), t1 (3000 B, ready first).
SIZES = {0: 1000, 1: 3000}


def two_tensors(before: float = 0.07) -> RunProfile:
    return run_of([("t0", 1000, 0.010, "a"), ("t1", 3000, 0.0, "b")],
                  [("", 0.0), ("a", 0.01), ("b", 0.05)], before, 0.004)


def test_sync_two_blocks_in_ready_order() -> None:
    # First gradient at 70 ms. Block 0 (t1, 32 ms) runs 70-102 ms; block 1 (t0, ready at 80 ms,
    # 12 ms) waits for the channel: 102-114 ms. Backward ends at 80 ms; step() waits until
    # 114 ms, then the update takes 4 ms: 118 ms.
    result = simulate(two_tensors(), allreduce_plan([1], [0], sizes=SIZES), NET, Mode.SYNC)
    assert result.iteration_s == pytest.approx(0.118)
    assert spans(result, "network") == [("allreduce", 0.07, 0.102), ("allreduce", 0.102, 0.114)]
    assert spans(result, "wait") == [("synchronize", 0.08, 0.114)]
    assert result.comm_busy_s == pytest.approx(0.044)
    assert result.compute_s == pytest.approx(0.07 + 0.01 + 0.004)
    assert result.wait_s == pytest.approx(0.034)
    assert result.wire_bytes == pytest.approx(4000)  # 2 (p-1)/p n, summed
    assert result.notes == []


def test_sync_fused_block() -> None:
    # One block of 4000 B (42 ms) once both are ready at 80 ms: 122 ms, + 4 ms update.
    result = simulate(two_tensors(), allreduce_plan([1, 0], sizes=SIZES), NET, Mode.SYNC)
    assert result.iteration_s == pytest.approx(0.126)


def test_overlap_forward_waits_for_a_late_block() -> None:
    # Plan sends t0 (module a, front) first: at first gradient g, block 0 waits for t0 (g+10 ms)
    # and runs to g+22 ms; block 1 (t1) runs g+22..g+54 ms. Backward ends at g+10 ms = S, the
    # next iteration's start. Forward from S: module a waits for block 0 until S+12, update
    # 4 ms * 1000/4000 = 1 ms, runs 10 ms -> S+23; module b waits for block 1 until S+44,
    # update 3 ms -> S+47, runs 50 ms -> S+97; loss and backward start (70 - 60 ms) -> S+107;
    # backward 10 ms -> S+117.
    result = simulate(two_tensors(), allreduce_plan([0], [1], sizes=SIZES), NET, Mode.OVERLAP)
    assert result.iteration_s == pytest.approx(0.117)
    assert spans(result, "wait") == [("a", 0.0, 0.012), ("b", 0.023, 0.044)]
    assert [e for e in spans(result, "compute") if e[0] == "update"] == \
        [("update", 0.012, 0.013), ("update", 0.044, 0.047)]
    # The previous iteration's blocks run during this forward; this iteration's first block
    # starts 10 ms after its first gradient (S+107+10 ms) is past the window's end.
    assert spans(result, "network") == [("allreduce", -0.0, 0.012), ("allreduce", 0.012, 0.044)]
    # Synchronously the same plan ends at g+54 ms + 4 ms update = 70 + 58 = 128 ms.
    assert simulate(two_tensors(), allreduce_plan([0], [1], sizes=SIZES), NET,
                    Mode.SYNC).iteration_s == pytest.approx(0.128)


def test_overlap_steady_state_from_the_second_iteration() -> None:
    plan = allreduce_plan([0], [1], sizes=SIZES)
    # The first iteration follows a synchronous step: nothing to wait for, no updates.
    assert simulate(two_tensors(), plan, NET, Mode.OVERLAP, iterations=1).iteration_s == \
        pytest.approx(0.08)
    for n in (2, 3, 6):
        assert simulate(two_tensors(), plan, NET, Mode.OVERLAP, iterations=n).iteration_s == \
            pytest.approx(0.117)


def dear_plan(order: list[int], sizes: dict[int, int]) -> Plan:
    """Reduce-scatters in `order` (backward), all-gathers in tensor (forward) order."""
    blocks = [Block(i, (Piece(t, 0, sizes[t] // 4),), "float32", RS) for i, t in enumerate(order)]
    rs_of = {t: i for i, t in enumerate(order)}
    blocks += [Block(len(order) + t, (Piece(t, 0, sizes[t] // 4),), "float32", AG,
                     Stage.FORWARD, source=rs_of[t]) for t in sorted(sizes)]
    return Plan("dear", tuple(blocks))


def test_dear_reduce_scatter_then_all_gather_in_forward() -> None:
    # RS(t1) = 1 + 15 = 16 ms from g; RS(t0) ready g+10, runs g+16..g+22 = S+6..S+12.
    # step() releases AG(t0) at S: it starts after RS(t0), S+12..S+18 (6 ms). Module a needs it
    # and releases AG(t1) (look-ahead): S+18..S+34. a waits to S+18, update 1 ms, runs 10 ms
    # -> S+29; b waits for AG(t1) to S+34, update 3 ms, runs 50 ms -> S+87; +10 ms loss,
    # +10 ms backward: 107 ms.
    result = simulate(two_tensors(), dear_plan([1, 0], SIZES), NET, Mode.OVERLAP)
    assert result.iteration_s == pytest.approx(0.107)
    assert spans(result, "wait") == [("a", 0.0, 0.018), ("b", 0.029, 0.034)]
    network = spans(result, "network")
    assert network[:4] == [("reduce_scatter", -0.01, 0.006), ("reduce_scatter", 0.006, 0.012),
                           ("all_gather", 0.012, 0.018), ("all_gather", 0.018, 0.034)]
    assert [e.block_id for e in result.events if e.lane == "network"][:4] == [0, 1, 2, 3]
    assert result.comm_busy_s == pytest.approx(0.016 + 0.006 + 0.006 + 0.016)
    assert result.wire_bytes == pytest.approx(2 * (500 + 1500))  # (p-1)/p n per RS and per AG


def test_dear_all_gather_released_one_block_ahead() -> None:
    # Three 1000 B tensors, all ready at once, modules a, b, c of 50 ms each, no update cost.
    # RS blocks end at S+6, S+12, S+18 (S = first gradient, backward of zero length).
    # AG(t0) released at S: S+18..S+24; a releases AG(t1): S+24..S+30; a waits to S+24 and runs
    # to S+74; only then does b release AG(t2): S+74..S+80, done before c needs it at S+124.
    run = run_of([("t0", 1000, 0.0, "a"), ("t1", 1000, 0.0, "b"), ("t2", 1000, 0.0, "c")],
                 [("a", 0.05), ("b", 0.05), ("c", 0.05)], 0.15, 0.0)
    result = simulate(run, dear_plan([2, 1, 0], {0: 1000, 1: 1000, 2: 1000}), NET, Mode.OVERLAP)
    gathers = [e for e in spans(result, "network") if e[0] == "all_gather"]
    assert gathers == [("all_gather", 0.018, 0.024), ("all_gather", 0.024, 0.03),
                       ("all_gather", 0.074, 0.08)]
    assert result.iteration_s == pytest.approx(0.024 + 0.15)


def test_tensor_without_module_is_applied_at_the_end_of_forward() -> None:
    # t1 has no module: the root's forward hook waits for every block (S+44) and applies it.
    run = run_of([("t0", 1000, 0.010, "a"), ("t1", 3000, 0.0, None)],
                 [("", 0.0), ("a", 0.01), ("b", 0.05)], 0.07, 0.004)
    result = simulate(run, allreduce_plan([0], [1], sizes=SIZES), NET, Mode.OVERLAP)
    # a: wait to S+12, update 1 ms, 10 ms -> S+23; b 50 ms -> S+73; end of forward: block 1
    # was done at S+44, update 3 ms -> S+76; loss 10 ms, backward 10 ms -> S+96.
    assert result.iteration_s == pytest.approx(0.096)
    assert spans(result, "wait") == [("a", 0.0, 0.012)]


def test_missing_compute_fields_use_documented_fallbacks() -> None:
    run = run_of([("t0", 1000, 0.010, "a"), ("t1", 3000, 0.0, "b")],
                 [("", 0.0), ("a", 0.01), ("b", 0.05)], None, None)
    result = simulate(run, allreduce_plan([1], [0], sizes=SIZES), NET, Mode.SYNC)
    # before_first_ready = the modules' forward (60 ms), no update: 60 + 32 + 12 ms
    assert result.iteration_s == pytest.approx(0.104)
    assert any("before_first_ready_s missing" in n for n in result.notes)
    assert any("step_s missing" in n for n in result.notes)


def test_overlap_needs_module_information() -> None:
    run = run_of([("t0", 1000, 0.0, None)], [], 0.01, 0.0)
    with pytest.raises(ValueError, match="overlap mode needs 'modules'"):
        simulate(run, allreduce_plan([0], sizes=SIZES), NET, Mode.OVERLAP)


def test_one_worker_is_compute_only() -> None:
    alone = LinkNetwork(1, 1e5, 1e-3)
    result = simulate(two_tensors(), allreduce_plan([1], [0], sizes=SIZES), alone, Mode.SYNC)
    assert result.iteration_s == pytest.approx(0.07 + 0.01 + 0.004)
    assert result.comm_busy_s == 0.0 and result.wire_bytes == 0.0


def test_overlap_steps_a_large_group_piece_by_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    # t1 in three partitions of 1000 B after t0's block: blocks done at S+12, 24, 36, 48 ms.
    # Stepped whole, module b waits for S+48, updates 3 ms, runs 50 ms: loss and backward start
    # (10 ms) and backward (10 ms) end at S+121. In pieces of 1000 B, each piece's 1 ms update
    # follows its block, the last at S+48..49, so everything after moves 2 ms earlier.
    plan = Plan("test", (Block(0, (Piece(0, 0, 250),), "float32"),
                         *(Block(i, (Piece(1, 250 * (i - 1), 250),), "float32")
                           for i in (1, 2, 3))))
    assert simulate(two_tensors(), plan, NET, Mode.OVERLAP).iteration_s == pytest.approx(0.121)
    monkeypatch.setattr(pieces, "PIECE_BYTES", 1000)
    result = simulate(two_tensors(), plan, NET, Mode.OVERLAP)
    assert result.iteration_s == pytest.approx(0.119)
    assert [e for e in spans(result, "compute") if e[0] == "update"] == \
        [("update", 0.012, 0.013), ("update", 0.024, 0.025), ("update", 0.036, 0.037),
         ("update", 0.048, 0.049)]
