"""The floor of a schedule (sim/floor.py) on hand-made profiles with answers worked out on paper,
and checked as a lower bound of every simulated plan of the built-in profiles.

Network as in test_sim_simulate: all-reduce(n) = 2 ms + n * 10 us (2 workers, 100 kB/s)."""

from __future__ import annotations

import pytest
from test_sim_simulate import NET, run_of, two_tensors

from commsched.config import load_config
from commsched.sim import BUILTIN_PROFILES, LinkNetwork, load_profile
from commsched.sim.floor import cheapest_transfer, schedule_floor, use_offsets
from commsched.sim.rank import PlanCache, allowed_policies, knob_grid, mode_of
from commsched.sim.simulator import simulate


def test_two_tensors_window_of_both() -> None:
    # t0: 1000 B, ready 10 ms after the first gradient, used first (module a at 0 ms);
    # t1: 3000 B, ready first, used at 10 ms (module b). First gradient at 70 ms.
    # Windows: {t0} alone: 70 + 10 - 0 + 2 + 10 = 92 ms; both (r = 0, u = 10 ms):
    # 70 + 0 - 10 + 2 + 40 = 102 ms. Compute: 70 + 10 + 4 (step) = 84 ms; naive 84 ms.
    floor = schedule_floor(two_tensors(), NET)
    assert floor.floor_s == pytest.approx(0.102)
    assert floor.compute_s == pytest.approx(0.084)
    assert floor.naive_s == pytest.approx(0.084)
    assert floor.gap_s == pytest.approx(0.018)
    assert sorted(floor.binding) == ["t0", "t1"]


def test_tied_weight_adds_its_whole_transfer() -> None:
    # embed (5 ms) first uses "tied", whose gradient is ready last (30 ms); body (20 ms) uses a
    # tensor ready at 10 ms. First gradient at 40 ms. The window of "tied" alone:
    # 40 + 30 - 0 + 2 + 20 = 92 ms = forward + backward + its whole all-reduce.
    run = run_of([("tied", 2000, 0.030, "embed"), ("body.w", 1000, 0.010, "body")],
                 [("", 0.0), ("embed", 0.005), ("body", 0.020), ("head", 0.005)], 0.040, 0.003)
    assert use_offsets(run) == pytest.approx([0.0, 0.005])
    floor = schedule_floor(run, NET)
    assert floor.binding == ("tied",)
    assert floor.floor_s == pytest.approx(0.092)
    assert floor.compute_s == pytest.approx(0.073)
    assert floor.naive_s == pytest.approx(0.073)


def test_compute_bound_when_communication_fits() -> None:
    # 100 B each: windows are at most 70 + 10 + 2 + 1 = 83 ms < compute 84 ms.
    run = run_of([("t0", 100, 0.010, "a"), ("t1", 100, 0.0, "b")],
                 [("", 0.0), ("a", 0.01), ("b", 0.05)], 0.07, 0.004)
    floor = schedule_floor(run, NET)
    assert floor.floor_s == pytest.approx(0.084)
    assert floor.window_s == pytest.approx(0.083)


def test_without_modules_every_tensor_is_due_at_the_next_backward() -> None:
    run = run_of([("t0", 1000, 0.010, None), ("t1", 3000, 0.0, None)], [], 0.07, 0.004)
    floor = schedule_floor(run, NET)
    # r = 0, u = 70 ms, both: 70 - 70 + 2 + 40 = 42 ms; r = 10 ms, {t0}: 10 + 2 + 10 = 22 ms.
    assert floor.window_s == pytest.approx(0.042)
    assert floor.floor_s == pytest.approx(0.084)
    assert any("no module information" in note for note in floor.notes)


def test_the_channel_carries_every_gradient_once_per_period() -> None:
    # Both first used by b, after 90 ms of forward in a: module times that add up to more than
    # before_first_ready (70 ms), which timing noise allows. The widest window, r = 0 and
    # u = 90 ms, gives 70 - 90 + 2 + 70 = 52 ms, yet the channel carries all 7000 B every
    # iteration: 2 + 70 = 72 ms (below the 84 ms compute here; on a 4x slower link, 282 ms).
    run = run_of([("t0", 1000, 0.010, "b"), ("t1", 6000, 0.0, "b")],
                 [("", 0.0), ("a", 0.09), ("b", 0.05)], 0.07, 0.004)
    floor = schedule_floor(run, NET)
    assert floor.window_s == pytest.approx(0.002 + 7000 * 1e-5)
    assert floor.floor_s == pytest.approx(0.084)
    assert floor.naive_s == pytest.approx(0.084)
    slow = LinkNetwork(2, 2.5e4, 1e-3)  # all-reduce(n) = 2 ms + n * 40 us
    floor = schedule_floor(run, slow)
    assert floor.floor_s == pytest.approx(0.002 + 7000 * 4e-5)
    assert floor.floor_s == pytest.approx(floor.naive_s) and floor.gap_s >= 0
    assert sorted(floor.binding) == ["t0", "t1"]


def test_cheapest_transfer_is_the_all_reduce_on_a_ring() -> None:
    alpha, beta = cheapest_transfer(NET)
    assert alpha == pytest.approx(0.002)
    assert beta == pytest.approx(1e-5)


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
@pytest.mark.parametrize("gbit", [1.0, 10.0])
def test_no_simulated_plan_beats_the_floor(name: str, gbit: float) -> None:
    run = load_profile(name)
    net = LinkNetwork(4, gbit * 1.25e8, 5e-5)
    floor = schedule_floor(run, net)
    assert floor.floor_s >= floor.naive_s * (1 - 1e-9) or floor.floor_s >= floor.compute_s
    cache = PlanCache(run, load_config({}, environ={}))
    fastest = min(simulate(run, cache.plan(p, knobs, net), net, mode_of(p)).iteration_s
                  for p in allowed_policies(run, overlap_allowed=True) for knobs in knob_grid(p))
    assert fastest >= floor.floor_s * (1 - 1e-9)
    # The floor is reachable up to the plans' own costs: within 2x of the best plan.
    assert fastest <= 2 * floor.floor_s
