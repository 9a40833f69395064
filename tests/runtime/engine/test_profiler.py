from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from helpers import step_alike

from commsched.plan import NetModel, TensorSpec
from commsched.runtime.engine.collective_fit import fit_alpha_beta, fit_collective
from commsched.runtime.engine.profiler import (
    KEEP_COLLECTIVE_SAMPLES,
    EventSpan,
    Profiler,
    profile_document,
)
from commsched.runtime.engine.step_clock import UpdateTimer


def test_fit_recovers_alpha_beta() -> None:
    samples = [(n, 2e-4 + 3e-9 * n) for n in (1_000, 10_000, 100_000, 1_000_000)]
    net = fit_alpha_beta(samples)
    assert net.alpha == pytest.approx(2e-4, rel=1e-6)
    assert net.beta == pytest.approx(3e-9, rel=1e-6)


def test_fit_clamps_noise_and_handles_one_size() -> None:
    assert fit_alpha_beta([(100, 5e-3), (200, 1e-3)]).beta == 0.0
    one = fit_alpha_beta([(1000, 1e-3), (1000, 1e-3)], NetModel(alpha=1e-4, beta=1e-9))
    assert one.alpha == pytest.approx(1e-4) and one.beta == pytest.approx(9e-7)
    assert fit_alpha_beta([]) == NetModel()


def test_profile_is_median_ready_time_of_the_latest_half() -> None:
    prof = Profiler(num_tensors=3)
    prof.record([900, 50, -1], [])  # warm-up iterations: slow, dropped
    prof.record([1_000_300, 1_000_000, 1_000_100], [(0, 400, 0, 0, 10, 10)])
    prof.record([2_000_500, 2_000_000, 2_000_100], [(0, 800, 0, 0, 20, 20)])
    prof.record([3_000_300, 3_000_000, 3_000_300], [(0, 400, 0, 0, 10, 10)])
    profile = prof.profile()
    assert profile.ready_times == pytest.approx((400e-6, 0.0, 200e-6))
    for seconds in (9.0, 5.0, 1.0, 1.2, 0.8):
        prof.note("before_first_ready_s", seconds)
    assert prof.compute()["before_first_ready_s"] == pytest.approx(1.0)  # median of 1.0, 1.2, 0.8
    # Collectives too: the latest half of the iterations that recorded any.
    assert prof.collective_samples == [(800, 20e-6), (400, 10e-6)]
    net = prof.net_model(alpha=5.0)
    assert net.alpha == 5.0 and net.beta == pytest.approx(2.5e-8)


def test_a_restarted_window_keeps_its_figures_until_the_next_recorded_iteration() -> None:
    """Note [Sampling the profile]: when the plan settles, the profile becomes the settled
    plan's from its first recorded iteration on; until then it is what it was."""
    prof = Profiler(num_tensors=2)
    for _ in range(4):  # another plan's iterations (auto's trials)
        prof.note("before_first_ready_s", 9.0)
        prof.record([0, 900], [(0, 400, 0, 0, 90, 90)])
        prof.note("step_s", 7.0)
    prof.restart_window()
    assert prof.profile().ready_times == pytest.approx((0.0, 900e-6))  # not emptied yet
    assert prof.compute() == {"before_first_ready_s": 9.0, "step_s": 7.0}
    prof.note("before_first_ready_s", 1.0)  # the settled plan's first recorded iteration
    prof.record([0, 100], [(0, 400, 0, 0, 10, 10)])
    prof.note("step_s", 0.5)
    assert prof.iterations == 1 and prof.iteration_rows()[0].before_first_ready_s == 1.0
    assert prof.profile().ready_times == pytest.approx((0.0, 100e-6))
    assert prof.compute() == {"before_first_ready_s": 1.0, "step_s": 0.5}
    assert prof.collective_samples == [(400, 10e-6)]
    prof.record([0, 300], [(0, 400, 0, 0, 30, 30)])  # and the window grows again
    assert prof.iterations == 2


def test_collective_fit_is_least_squares_on_an_exact_line() -> None:
    samples = [(n, 2e-4 + 3e-9 * n) for n in (1_000, 10_000, 100_000, 1_000_000)]
    net = fit_collective(samples)
    assert net.alpha == pytest.approx(2e-4, rel=1e-6)
    assert net.beta == pytest.approx(3e-9, rel=1e-6)
    one = fit_collective([(1000, 1e-3), (1000, 1e-3)], NetModel(alpha=1e-4, beta=1e-9))
    assert one == fit_alpha_beta([(1000, 1e-3), (1000, 1e-3)], NetModel(alpha=1e-4, beta=1e-9))
    assert fit_collective([]) == NetModel()


def test_collective_fit_keeps_the_total_under_blocks_in_flight_together() -> None:
    # Per iteration: small blocks of 1 ms alone, or 40 ms behind a late peer; two 8 MB blocks
    # in flight together, 200 ms for both, of which the first to finish took 180 ms and the
    # second the last 20 ms. Least squares makes bulk bytes cheaper than they were.
    samples = [(4_000, 1e-3), (4_000, 40e-3), (8_000, 1e-3), (8_000, 40e-3),
               (8_000_000, 180e-3), (8_000_000, 20e-3)] * 3
    total_s = sum(t for _, t in samples)
    least_squares, fitted = fit_alpha_beta(samples), fit_collective(samples)
    assert fitted.alpha == pytest.approx(1e-3)
    assert least_squares.alpha > 10e-3
    predicted = sum(fitted.time(n) for n, _ in samples)
    assert predicted == pytest.approx(total_s)
    assert fitted.time(16_000_000) > least_squares.time(16_000_000)


def test_collective_samples_keep_a_bounded_window() -> None:
    prof = Profiler(num_tensors=1)
    blocks = [(0, 1000, 0, 0, 10, 10)] * 100
    for _ in range(2 * KEEP_COLLECTIVE_SAMPLES // 100):
        prof.record([0], blocks)
    kept = sum(len(s) for r in prof.collective_rounds for s in r.values())
    assert kept <= KEEP_COLLECTIVE_SAMPLES and len(prof.collective_rounds) > 1
    # One plan throughout: its 100 blocks, each at its median.
    assert prof.collective_samples == [(1000, 10e-6)] * 100


def test_each_block_costs_its_median_over_the_iterations_of_its_plan() -> None:
    # A plan of two small blocks and a large one (1 ms start-up, 1 us per byte); of the six
    # iterations in the window, one had a small block wait 150 ms for a late peer, another
    # 20 ms.
    prof = Profiler(num_tensors=1)
    plain = [(0, 100, 0, 0, 1100, 1100), (1, 100, 0, 0, 1100, 1100),
             (2, 9000, 0, 0, 10_000, 10_000)]
    stalled = [(0, 100, 0, 0, 151_100, 151_100)] + plain[1:]
    late = [plain[0], (1, 100, 0, 0, 21_100, 21_100), plain[2]]
    for blocks in [[(0, 64, 0, 0, 50, 50)]] + [plain] * 4 + [plain, stalled, plain, late,
                                                              plain, plain]:
        prof.record([0], blocks)
    samples = prof.samples_by_op["allreduce"]
    assert samples == [(100, pytest.approx(1.1e-3)), (100, pytest.approx(1.1e-3)),
                       (9000, pytest.approx(10e-3))]
    net = prof.net_model()
    assert (net.alpha, net.beta) == (pytest.approx(1e-3), pytest.approx(1e-6))
    # Every sample would have charged the stalls to every byte, 4x the link's cost.
    mean = fit_collective([s for r in prof.collective_rounds[5:] for s in r["allreduce"]])
    assert mean.beta > 3 * net.beta
    # A second plan in the window: its blocks at their own medians, after the first plan's.
    for blocks in ([(0, 200, 0, 0, 2000, 2000)], [(0, 200, 0, 0, 4000, 4000)],
                   [(0, 200, 0, 0, 2500, 2500)]):
        prof.record([0], blocks)
    assert prof.samples_by_op["allreduce"] == [
        (100, pytest.approx(1.1e-3)), (100, pytest.approx(1.1e-3)),
        (9000, pytest.approx(10e-3)), (200, pytest.approx(2.5e-3))]


class _FakeEvent:
    """Stands in for torch.cuda.Event (no device here): reached once `reached` is set, or
    after `after` more queries; its time is `at_ms`."""

    def __init__(self, at_ms: float, after: int = -1) -> None:
        self.at_ms, self.reached, self.after, self.queries = at_ms, False, after, 0

    def query(self) -> bool:
        self.queries += 1
        self.reached = self.reached or 0 <= self.after < self.queries
        return self.reached

    def elapsed_time(self, end_event: _FakeEvent) -> float:
        assert self.reached and end_event.reached
        return end_event.at_ms - self.at_ms


def test_figures_say_which_clock_they_came_from() -> None:
    prof = Profiler(num_tensors=1)
    assert prof.clocks == {}
    prof.record([10], [(0, 400, 10, 12, 20, 8)], ["allreduce"])
    prof.note("step_s", 0.1)
    prof.note_update(100, 1e-3)
    assert prof.clocks == {"ready_time_s": "cpu", "collective_s": "cpu", "compute_s": "cpu",
                           "update_s": "cpu"}
    prof.record([10], [(0, 400, 10, 12, 20, 8)], ["allreduce"],
                {"ready": "device_event", "collective": "device_event"})
    assert prof.clocks["ready_time_s"] == prof.clocks["collective_s"] == "device_event"
    doc = profile_document([TensorSpec(0, "w", 100, "float32", 4, 0)], prof, 1, [], {})
    assert doc["clocks"] == prof.clocks
    assert doc["collectives"]["allreduce"]["clock"] == "device_event"


def test_device_timed_updates_are_read_once_the_device_passed_them() -> None:
    prof = Profiler(num_tensors=1)
    first = EventSpan(_FakeEvent(0.0), _FakeEvent(2.0))
    second = EventSpan(_FakeEvent(5.0), _FakeEvent(9.0, after=3))
    for span in (first, second):
        span.start.reached = True  # type: ignore[attr-defined]
    prof.note_update(1000, first)
    assert prof.update_samples == [] and prof.clocks["update_s"] == "device_event"
    first.end.reached = True  # type: ignore[attr-defined]
    prof.note_update(3000, second)  # reads the first, which the device has passed, not yet this
    assert prof.update_samples == [(1000, pytest.approx(2e-3))]
    cost = prof.update_cost()  # waits for the rest: both sizes, a fit
    assert second.end.queries == 4  # type: ignore[attr-defined]
    assert prof.update_samples == [(1000, pytest.approx(2e-3)), (3000, pytest.approx(4e-3))]
    assert cost is not None
    assert (cost.alpha, cost.beta) == (pytest.approx(1e-3), pytest.approx(1e-6))


def test_waiting_for_a_device_timed_update_has_a_timeout() -> None:
    prof = Profiler(num_tensors=1, timeout_s=0.05)
    start, never = _FakeEvent(0.0), _FakeEvent(1.0)
    start.reached = True
    prof.note_update(10, EventSpan(start, never))
    prof.note_update(20, 1e-3)
    with pytest.raises(TimeoutError, match=r"timed out after 0.05 s \(COMMSCHED_TIMEOUT\)"):
        prof.update_cost()


@pytest.mark.parametrize(("make", "first_is_sample"), [
    (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), False),
    (lambda params: torch.optim.Adam(params, lr=0.1), False),
    (lambda params: torch.optim.SGD(params, lr=0.1), True),  # makes no state
])
def test_a_call_that_makes_the_optimizers_state_is_no_sample(
        make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        first_is_sample: bool) -> None:
    """Note [A first call makes the optimizer's state]: the profiler keeps that call apart,
    every later one as a sample, and every call of an optimizer that makes no state."""
    params = [torch.nn.Parameter(torch.ones(1000)) for _ in range(2)]
    optimizer = make(params)
    prof = Profiler(num_tensors=2)
    for _ in range(3):
        for p in params:
            p.grad = torch.ones_like(p)
        timer = UpdateTimer(params, optimizer.state)
        optimizer.step()
        prof.note_update(8000, timer.stop(), timer.made_state)
    assert len(prof.update_samples) == (3 if first_is_sample else 2)
    assert len(prof.first_update_samples) == (0 if first_is_sample else 1)
    assert all(seconds > 0 for _, seconds in prof.update_samples)
    # Without the state, every call is a sample (a caller that cannot name it).
    timer = UpdateTimer(params)
    optimizer.step()
    assert isinstance(timer.stop(), float) and not timer.made_state


def test_first_calls_are_fitted_only_where_later_ones_lack_two_sizes() -> None:
    prof = Profiler(num_tensors=1)
    prof.note_update(1000, 1e-3, made_state=True)
    prof.note_update(4000, 90e-3, made_state=True)  # slow: it made the state
    prof.note_update(4000, 4e-3)
    fallback = prof.update_cost()  # one size of later calls: the first ones make the fit
    assert fallback is not None and fallback.beta > 5e-6  # the slow first call leans on it
    prof.note_update(2000, 2e-3)
    cost = prof.update_cost()
    assert cost is not None
    assert (cost.alpha, cost.beta) == (pytest.approx(0.0, abs=1e-9), pytest.approx(1e-6))


def test_the_split_profiling_update_steps_once_even_when_it_is_no_sample() -> None:
    """The profiling steps' two calls (DeferredUpdates.step_all_in_two_calls) make SGD's
    momentum at the first step: no samples then, but the update is made once, as one call
    of the user's optimizer makes it."""
    import commsched

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    twin = copy.deepcopy(model)
    ours = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model=model,
        named_parameters=model.named_parameters(), policy="bytescheduler", profile_steps=3)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    profiler = ours.session.engine.profiler
    counts = []
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        step_alike(((model, ours), (twin, plain)), x)
        counts.append(len(profiler.update_samples))
    assert counts[:2] == [0, 2]  # the first step's calls made the momentum; the next two count
    assert len(profiler.first_update_samples) == 2
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    ours.session.close()
