from __future__ import annotations

import pytest

from commsched.plan import NetModel
from commsched.runtime.profiler import Profiler, fit_alpha_beta


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
    prof.record([3_000_300, 3_000_000, 3_000_300], [])
    profile = prof.profile()
    assert profile.ready_times == pytest.approx((400e-6, 0.0, 200e-6))
    for seconds in (9.0, 5.0, 1.0, 1.2, 0.8):
        prof.note("before_first_ready_s", seconds)
    assert prof.compute()["before_first_ready_s"] == pytest.approx(1.0)  # median of 1.0, 1.2, 0.8
    assert prof.collective_samples == [(400, 10e-6), (800, 20e-6)]
    net = prof.net_model(alpha=5.0)
    assert net.alpha == 5.0 and net.beta == pytest.approx(2.5e-8)
