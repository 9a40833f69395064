from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from commsched.runtime.engine.profiler import Profiler
from commsched.runtime.planning.world_profile import (
    IterationRow,
    critical_rank,
    document_samples,
    waited_s,
    with_world_compute,
    world_compute,
)


def test_the_rank_the_others_wait_for_waited_least() -> None:
    # Rank 1 is behind: ranks 0 and 2 hold the lag in their blocks, rank 1 the transfers.
    ranks = [{"allreduce": [(100, 0.050), (4000, 0.060)]},
             {"allreduce": [(100, 0.001), (4000, 0.011)]},
             {"allreduce": [(100, 0.030)], "all_gather": [(4000, 0.040)]}]
    assert [waited_s(r) for r in ranks] == pytest.approx([0.110, 0.012, 0.070])
    assert critical_rank([waited_s(r) for r in ranks]) == 1
    assert critical_rank([0.0, 0.0]) == 0  # nothing timed (a world of one): rank 0
    assert critical_rank([0.2, 0.1, 0.1]) == 1  # the lowest rank among equals
    document = {"collectives": {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9,
                                              "samples": [[100, 0.001], [4000, 0.011]]}}}
    assert waited_s(document_samples(document)) == pytest.approx(0.012)
    assert waited_s(document_samples({"collectives": {}})) == 0.0



def _rows(before: Sequence[float], ready: Sequence[Sequence[float]]) -> list[IterationRow]:
    return [IterationRow(b, tuple(r)) for b, r in zip(before, ready, strict=True)]


def test_each_gradient_is_ready_when_the_last_rank_has_it() -> None:
    # Rank 0 is slower in iterations 0 and 2, rank 1 in 1 and 3; neither rank is the slower one
    # in the median.
    rank0 = _rows([0.30, 0.10] * 2, [[0.0, 0.2, 0.3], [0.0, 0.1, 0.2]] * 2)
    rank1 = _rows([0.10, 0.30] * 2, [[0.0, 0.1, 0.2], [0.0, 0.2, 0.3]] * 2)
    world = world_compute([rank0, rank1])
    assert world is not None
    # Each iteration, the later rank: 0.3 s before its first gradient, the others 0.2 and 0.3 s
    # after it; either rank alone has a median of 0.2 s and 0.15 / 0.25 s.
    assert world.before_first_ready_s == pytest.approx(0.3)
    assert world.ready_times == pytest.approx((0.0, 0.2, 0.3))


def test_world_compute_aligns_ranks_from_the_latest_iteration() -> None:
    # Rank 1 kept one iteration more (at the front): the latest rows are the same iterations.
    rank0 = _rows([0.1, 0.1, 0.1], [[0.0, 0.1]] * 3)
    rank1 = _rows([5.0, 0.2, 0.2, 0.2], [[0.0, 5.0]] + [[0.0, 0.3]] * 3)
    world = world_compute([rank0, rank1])
    assert world is not None
    assert world.before_first_ready_s == pytest.approx(0.2)
    assert world.ready_times == pytest.approx((0.0, 0.3))


def test_world_compute_needs_every_ranks_figures() -> None:
    one = _rows([0.1, 0.1], [[0.0, 0.1]] * 2)
    assert world_compute([one]) is None  # a world of one: its own profile as it is
    assert world_compute([one, []]) is None
    unmeasured = _rows([-1.0, -1.0], [[0.0, 0.1]] * 2)  # no compute before the first gradient
    assert world_compute([one, unmeasured]) is None
    # A tensor no rank marked stays unmeasured.
    partly = _rows([0.1, 0.1], [[0.0, -1.0]] * 2)
    world = world_compute([partly, partly])
    assert world is not None and world.ready_times == (0.0, None)


def test_with_world_compute_replaces_ready_times_and_compute_before_them() -> None:
    document: dict[str, Any] = {"compute": {"before_first_ready_s": 0.1, "step_s": 0.01},
                "tensors": [{"id": 0, "ready_time_s": 0.0}, {"id": 1, "ready_time_s": 0.1}]}
    world = world_compute([_rows([0.1] * 2, [[0.0, 0.1]] * 2), _rows([0.2] * 2, [[0.0, 0.3]] * 2)])
    out = with_world_compute(document, world)
    assert out["compute"] == {"before_first_ready_s": pytest.approx(0.2), "step_s": 0.01}
    assert [t["ready_time_s"] for t in out["tensors"]] == pytest.approx([0.0, 0.3])
    assert document["tensors"][1]["ready_time_s"] == 0.1  # a copy
    assert with_world_compute(document, None) is document


def test_the_profiler_keeps_each_sampled_iterations_compute_before_its_gradients() -> None:
    prof = Profiler(num_tensors=2)
    # Every iteration describes the plan (Note [Sampling the profile]).
    prof.restart_window(steady=True)
    prof.record([100, 300], [])  # no compute before it measured yet (the first iteration)
    prof.note("before_first_ready_s", 0.05)
    prof.record([1000, 1500], [])
    prof.note("before_first_ready_s", 0.07)
    prof.record([-1, 2000], [])
    prof.record([0, 100], [])  # after a pause (flush): not measured, not the last one again
    assert prof.iteration_rows() == [IterationRow(-1.0, (0.0, 0.0002)),
                                     IterationRow(0.05, (0.0, 0.0005)),
                                     IterationRow(0.07, (-1.0, 0.0)),
                                     IterationRow(-1.0, (0.0, 0.0001))]


def test_only_a_settled_plans_window_describes_it_whole() -> None:
    """Note [Sampling the profile]: before the plan settles, the window's first half is warm-up
    or another plan's; once it has, the window restarts and all of it is the settled plan's."""
    prof = Profiler(num_tensors=1)
    for before in (9.0, 9.0, 0.2, 0.2):
        prof.note("before_first_ready_s", before)
        prof.record([0], [(0, 400, 0, 0, 10, 10)])
    assert [row.before_first_ready_s for row in prof.iteration_rows()] == [0.2, 0.2]
    assert prof.compute()["before_first_ready_s"] == pytest.approx(0.2)
    prof.restart_window(steady=True)
    for before in (0.1, 0.3, 0.2, 0.2):
        prof.note("before_first_ready_s", before)
        prof.record([0], [(0, 400, 0, 0, 10, 10)])
    assert [row.before_first_ready_s for row in prof.iteration_rows()] == [0.1, 0.3, 0.2, 0.2]
    assert prof.compute()["before_first_ready_s"] == pytest.approx(0.2)
    assert len(prof.collective_rounds) == 4 and prof.collective_samples == [(400, 10e-6)]
    prof.restart_window()  # another plan (a trial) from the next recorded iteration
    prof.note("before_first_ready_s", 0.5)
    prof.record([0], [])
    assert not prof.steady
    prof.restart_window(steady=True)
    prof.unsteady()  # the plan changed again before the restart took effect
    prof.no_compute_before()  # and this iteration followed a pause
    prof.record([0], [])
    assert not prof.steady and prof.iteration_rows() == [IterationRow(-1.0, (0.0,))]
    assert "before_first_ready_s" not in prof.compute()  # the earlier plan's is not kept
