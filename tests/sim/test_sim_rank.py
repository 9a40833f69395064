"""Ranking candidate plans, the scaling factor and the compression search."""

from __future__ import annotations

import math

import pytest
from test_sim_simulate import two_tensors

from commsched.config import Policy, load_config
from commsched.plan import NetModel
from commsched.sim import LinkNetwork, load_profile, rank_candidates
from commsched.sim.rank import CREDIT_PARTITIONS, PlanCache, knob_grid, planned_policies
from commsched.sim.whatif import compute_only_s, smallest_ratio

BASE = load_config({}, environ={})
NET = LinkNetwork(2, 1e5, 1e-3)


def test_rank_candidates_sorted_and_complete() -> None:
    ranked = rank_candidates(two_tensors(), NET, BASE, overlap_allowed=True)
    times = [r.predicted_s for r in ranked]
    assert times == sorted(times)
    expected = sum(len(knob_grid(p)) for p in planned_policies())
    assert len(ranked) == expected
    assert {r.policy for r in ranked} == set(planned_policies())
    for r in ranked:
        assert r.plan.policy == r.policy.value
    assert all(p.value != "auto" for p in planned_policies())


def test_overlap_policies_only_when_allowed_and_profiled() -> None:
    synchronous = {Policy.HOROVOD, Policy.DDP, Policy.MGWFBP}
    ranked = rank_candidates(two_tensors(), NET, BASE, overlap_allowed=False)
    assert {r.policy for r in ranked} == synchronous
    run = two_tensors()
    no_modules = type(run)(run.schema_version, run.world_size, tuple(
        type(t)(**{**t.__dict__, "module": None}) for t in run.tensors), (), 0.07, 0.004)
    assert {r.policy for r in rank_candidates(no_modules, NET, BASE, True)} == synchronous


def test_ties_are_broken_by_policy_order_then_knobs() -> None:
    # One worker: every plan costs the same, so the order is declaration order, smaller knobs
    # first: every rank picks the same plan.
    ranked = rank_candidates(two_tensors(), LinkNetwork(1, 1e5, 1e-3), BASE, False)
    assert ranked[0].policy is Policy.HOROVOD
    assert ranked[0].knobs == {"fusion_threshold": 4 << 20}
    order = [r.policy for r in ranked]
    assert order == sorted(order, key=list(Policy).index)
    again = rank_candidates(two_tensors(), LinkNetwork(1, 1e5, 1e-3), BASE, False)
    assert [(r.policy, r.knobs) for r in again] == [(r.policy, r.knobs) for r in ranked]


def test_configured_alpha_beta_reach_the_planners() -> None:
    cache = PlanCache(two_tensors(), load_config({"alpha": 0.5, "beta": 1e-3}, environ={}))
    assert cache.plan(Policy.MGWFBP, {}, NET) is cache.plan(Policy.MGWFBP, {}, NET)
    from commsched.sim.rank import planner_model

    assert planner_model(NET, cache.base_cfg) == NetModel(0.5, 1e-3)


def test_compute_only_iteration() -> None:
    run = two_tensors()
    # before_first_ready 70 ms + backward 10 ms + update 4 ms
    assert compute_only_s(run, PlanCache(run, BASE)) == pytest.approx(0.084)


def test_smallest_ratio_bisection() -> None:
    def scaling(ratio: float) -> float:
        return 1 / (0.5 + 1 / ratio)  # reaches 0.9 at ratio 1 / (1/0.9 - 0.5) = 1.636...

    found = smallest_ratio(scaling, 0.9)
    assert found is not None
    assert scaling(found) >= 0.9
    assert found == pytest.approx(1 / (1 / 0.9 - 0.5), rel=1e-3)
    assert smallest_ratio(lambda r: 0.95, 0.9) == 1.0
    assert smallest_ratio(lambda r: 0.8 - 1 / r, 0.9) is None  # capped below the target


def test_builtin_profiles_rank_with_overlap_policies() -> None:
    run = load_profile("vgg16")
    ranked = rank_candidates(run, LinkNetwork(16, 25e9 / 8, 2e-5), BASE, True)
    assert {r.policy for r in ranked} == set(planned_policies())
    assert all(math.isfinite(r.predicted_s) and r.predicted_s > 0 for r in ranked)


def test_a_partitioning_candidate_carries_a_credit_of_two_partitions() -> None:
    """Note [Credit follows the partition]: what `auto` installs is the candidate the
    benchmarks run, not its partitions under the configured 16 MiB credit."""
    for policy in (Policy.BYTESCHEDULER, Policy.PROPHET):
        grid = knob_grid(policy)
        assert grid and all(k["credit_bytes"] == CREDIT_PARTITIONS * k["partition_bytes"]
                            for k in grid)
    for policy in (Policy.HOROVOD, Policy.DDP, Policy.MGWFBP, Policy.DEAR):
        assert all("credit_bytes" not in k for k in knob_grid(policy))
    ranked = rank_candidates(two_tensors(), NET, BASE, overlap_allowed=True)
    partitioned = [r for r in ranked if "partition_bytes" in r.knobs]
    assert partitioned and all(r.knobs["credit_bytes"] == 2 * r.knobs["partition_bytes"]
                               for r in partitioned)
