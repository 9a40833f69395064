"""shard_optimizer in the simulator (sim/sharded.py), with answers worked out on paper.

The network and profiles are test_sim_simulate's: 2 workers, alpha = 1 ms, 100 kB/s, so
reduce-scatter(n) = all-gather(n) = 1 ms + n * 5 us. two_tensors' update costs step_s = 4 ms
for its 4000 B, with no fitted call cost: 1 us per byte, so a rank's half of t1 (1500 B) takes
1.5 ms and of t0 (500 B) 0.5 ms.
"""

from __future__ import annotations

import pytest
from test_sim_simulate import NET, SIZES, allreduce_plan, dear_plan, spans, two_tensors

from commsched.config import Policy, load_config
from commsched.plan.sharding import SHARDABLE_POLICIES
from commsched.sim import Mode, RunProfile, profile_from_document, rank_candidates, simulate
from commsched.sim.profile import ProfileError
from commsched.sim.timing import CompressorCompute, compute_times


def test_sync_sharded_updates_each_block_as_its_reduce_scatter_ends() -> None:
    # First gradient at 70 ms: RS(t1) 70-86, RS(t0) (ready 80) 86-92. Backward ends at 80;
    # step() waits for RS(t1) to 86, updates 1.5 ms and releases AG(t1): on the wire once
    # RS(t0) is done, 92-108; waits for RS(t0) (to 92), updates 0.5 ms, releases AG(t0):
    # 108-114. Unsharded, the same plan takes 118 ms (test_sync_two_blocks_in_ready_order).
    result = simulate(two_tensors(), allreduce_plan([1], [0], sizes=SIZES), NET, Mode.SYNC,
                      shards=2)
    assert result.iteration_s == pytest.approx(0.114)
    assert spans(result, "network") == [
        ("reduce_scatter", 0.07, 0.086), ("reduce_scatter", 0.086, 0.092),
        ("all_gather", 0.092, 0.108), ("all_gather", 0.108, 0.114)]
    assert [e for e in spans(result, "compute") if e[0] == "update"] == [
        ("update", 0.086, 0.0875), ("update", 0.092, 0.0925)]
    assert spans(result, "wait") == [("step", 0.08, 0.086), ("step", 0.0875, 0.092),
                                     ("synchronize", 0.0925, 0.114)]
    # The traffic of one all-reduce: a reduce-scatter and an all-gather per block.
    assert result.wire_bytes == pytest.approx(4000)


def test_dear_sharded_steps_at_step_and_copies_in_forward() -> None:
    # First gradient g, backward ends at g+10: RS(t1) g..g+16, RS(t0) g+16..g+22. step()
    # waits to g+16, updates 1.5 ms, waits to g+22, updates 0.5 ms: the next forward starts at
    # S = g+22.5. AG(t0), released at S, runs S..S+6; module a releases AG(t1): S+6..S+22.
    # a waits to S+6, its update is a copy (not charged), runs 10 ms -> S+16; b waits to S+22,
    # runs 50 ms -> S+72; loss and backward start 10 ms, backward 10 ms -> S+92; RS(t1)
    # S+82..S+98, update to S+99.5; RS(t0) S+98..S+104, update to S+104.5. Unsharded: 107 ms.
    result = simulate(two_tensors(), dear_plan([1, 0], SIZES), NET, Mode.OVERLAP, shards=2)
    assert result.iteration_s == pytest.approx(0.1045)
    assert spans(result, "wait") == [("a", 0.0, 0.006), ("b", 0.016, 0.022),
                                     ("step", 0.092, 0.098), ("step", 0.0995, 0.104)]
    assert [e for e in spans(result, "compute") if e[0] == "update"] == [
        ("update", 0.098, 0.0995), ("update", 0.104, 0.1045)]
    assert result.wire_bytes == pytest.approx(4000)


def test_fitted_call_cost_is_charged_per_block() -> None:
    # A fitted fixed cost per optimizer call is paid once per block on every rank.
    doc = {"schema_version": 2, "world_size": 2,
           "compute": {"before_first_ready_s": 0.07, "step_s": 0.004,
                       "update_fixed_s": 0.002, "update_per_byte_s": 1e-6},
           "tensors": [{"id": i, "name": n, "numel": b // 4, "dtype": "float32",
                        "forward_index": i, "ready_time_s": r, "module": None}
                       for i, (n, b, r) in enumerate([("t0", 1000, 0.01), ("t1", 3000, 0.0)])]}
    run = profile_from_document(doc)
    one = simulate(run, allreduce_plan([1, 0], sizes=SIZES), NET, Mode.SYNC, shards=2)
    two = simulate(run, allreduce_plan([1], [0], sizes=SIZES), NET, Mode.SYNC, shards=2)
    assert [e.duration_s for e in one.events if e.name == "update"] == \
        pytest.approx([0.002 + 2000e-6])
    assert [e.duration_s for e in two.events if e.name == "update"] == \
        pytest.approx([0.002 + 1500e-6, 0.002 + 500e-6])


def test_a_sharded_profile_scales_its_update_back_to_the_whole() -> None:
    doc = {"schema_version": 2, "world_size": 3, "update_shards": 3,
           "compute": {"before_first_ready_s": 0.07, "step_s": 0.002},
           "tensors": [{"id": 0, "name": "w", "numel": 250, "dtype": "float32",
                        "forward_index": 0, "ready_time_s": 0.0}]}
    run = profile_from_document(doc)
    assert run.update_shards == 3
    compute = compute_times(run, with_modules=False)
    assert compute.step_s == pytest.approx(0.006)
    assert compute.update.per_byte_s == pytest.approx(0.006 / 1000)
    assert any("sharded run" in note for note in compute.notes)
    assert profile_from_document({**doc, "update_shards": None}).update_shards == 1
    with pytest.raises(ProfileError, match="update_shards"):
        profile_from_document({**doc, "update_shards": 0})


def test_auto_under_sharding_ranks_only_the_shardable_policies() -> None:
    base = load_config({}, environ={})
    ranked = rank_candidates(two_tensors(), NET, base, overlap_allowed=True, shards=2)
    assert {r.policy.value for r in ranked} == set(SHARDABLE_POLICIES)
    for r in ranked:
        mode = Mode.OVERLAP if r.policy is Policy.DEAR else Mode.SYNC
        assert r.predicted_s == pytest.approx(
            simulate(two_tensors(), r.plan, NET, mode, shards=2).iteration_s)
    unsharded = {(r.policy, tuple(r.knobs.items())): r.predicted_s
                 for r in rank_candidates(two_tensors(), NET, base, overlap_allowed=True)}
    # Half of each update on every rank: no sharded candidate is slower than its unsharded twin
    # here (the traffic is the same, the update smaller).
    assert all(r.predicted_s <= unsharded[(r.policy, tuple(r.knobs.items()))] + 1e-12
               for r in ranked)


def test_sharding_refuses_a_compressor() -> None:
    with pytest.raises(ValueError, match="compressor"):
        simulate(two_tensors(), allreduce_plan([1], [0], sizes=SIZES), NET, Mode.SYNC,
                 compressor=CompressorCompute(0.001), shards=2)


def test_a_profile_of_the_same_sharded_run_sets_the_updates_total() -> None:
    # The run's own step_s holds what surrounds each call too: the calls' costs (1.5 and 0.5 ms
    # from the fit) are scaled to sum to it (3 ms); another world's profile keeps the fit's.
    def run(shards: int | None) -> RunProfile:
        doc = {"schema_version": 2, "world_size": 2, "update_shards": shards,
               "compute": {"before_first_ready_s": 0.07, "step_s": 0.003,
                           "update_fixed_s": 0.0, "update_per_byte_s": 1e-6},
               "tensors": [{"id": i, "name": n, "numel": b // 4, "dtype": "float32",
                            "forward_index": i, "ready_time_s": r, "module": None}
                           for i, (n, b, r) in enumerate([("t0", 1000, 0.01),
                                                          ("t1", 3000, 0.0)])]}
        return profile_from_document(doc)

    plan = allreduce_plan([1], [0], sizes=SIZES)
    own = simulate(run(2), plan, NET, Mode.SYNC, shards=2)
    assert [e.duration_s for e in own.events if e.name == "update"] == \
        pytest.approx([0.00225, 0.00075])
    other = simulate(run(None), plan, NET, Mode.SYNC, shards=2)
    assert [e.duration_s for e in other.events if e.name == "update"] == \
        pytest.approx([0.0015, 0.0005])
