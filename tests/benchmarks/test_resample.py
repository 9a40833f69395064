"""The interval a judged ratio covers over resampled rounds (benchmarks/harness/resample.py)."""

from __future__ import annotations

import random
import statistics

import pytest

from benchmarks.harness.measured_vs_predicted import auto_verdict
from benchmarks.harness.planner_pair import compare_pairs
from benchmarks.harness.prediction_report import auto_line, pair_lines
from benchmarks.harness.resample import interval, resampled, round_series, share_at_most


def test_round_series_needs_the_same_rounds_of_every_named_row() -> None:
    rows: list[dict] = [{"name": "a", "round_medians_ms": [1.0, 2.0]},
                        {"name": "b", "round_medians_ms": [3.0, 4.0]},
                        {"name": "c", "round_medians_ms": [5.0]},
                        {"name": "d"}]
    assert round_series(rows, ["a", "b"]) == {"a": [1.0, 2.0], "b": [3.0, 4.0]}
    assert round_series(rows, ["a", "c"]) is None  # not the same rounds
    assert round_series(rows, ["a", "d"]) is None  # no rounds recorded
    assert round_series(rows, ["a", "missing"]) is None
    assert round_series([rows[2]], ["c"]) is None  # one round: nothing to resample


def test_every_candidate_draws_the_same_rounds() -> None:
    # A slow phase shared by both candidates (the rounds of 200 ms) moves neither's median
    # apart from the other's: b is 5% slower in every round, so every draw says exactly 1.05.
    a = [100.0, 200.0, 100.0, 110.0, 210.0, 105.0]
    series = {"a": a, "b": [1.05 * x for x in a]}
    ratios = resampled(series, lambda m: m["b"] / m["a"], draws=300)
    assert interval(ratios) == pytest.approx((1.05, 1.05))


def test_a_noisy_ratio_gets_an_interval_around_it() -> None:
    series = {"a": [100.0, 104.0, 96.0, 108.0, 92.0, 100.0, 103.0, 97.0],
              "b": [100.0, 97.0, 103.0, 93.0, 107.0, 100.0, 98.0, 102.0]}
    ratios = resampled(series, lambda m: m["a"] / m["b"])
    low, high = interval(ratios)
    assert low < 1.0 < high and high - low > 0.02
    assert resampled(series, lambda m: m["a"] / m["b"]) == ratios  # seeded: reports repeat
    assert 0.0 < share_at_most(ratios, 1.0) < 1.0
    assert share_at_most([1.0, 1.01, 1.03, 1.05], 1.02) == 0.5


def test_the_report_shows_how_far_autos_ratio_could_move() -> None:
    rows = [{"name": "commsched:horovod", "median_ms": 100.0,
             "round_medians_ms": [100.0, 101.0, 99.0, 100.0]},
            {"name": "commsched:dear", "median_ms": 98.0,
             "round_medians_ms": [97.5, 99.0, 98.0, 98.0]},
            {"name": "commsched:auto", "median_ms": 99.0,
             "round_medians_ms": [98.5, 99.0, 99.0, 98.5]}]
    verdict = auto_verdict(rows, "commsched:auto", {"policy": "horovod", "knobs": {}})
    low, high = verdict["auto_vs_fastest_interval"]
    assert low <= verdict["auto_vs_fastest"] <= high
    assert verdict["auto_within_tolerance_share"] == 1.0  # no draw beats 99 / 97.5
    assert "within 2% in 100% of draws" in auto_line(verdict)
    del rows[0]["round_medians_ms"]
    assert "auto_vs_fastest_interval" not in auto_verdict(rows, "commsched:auto", {})


def test_the_pair_line_shows_the_ratios_interval() -> None:
    first, second = "commsched:prophet", "commsched:bytescheduler"
    rows = [{"name": first, "median_ms": 103.0, "round_medians_ms": [103.0, 101.0, 106.0]},
            {"name": second, "median_ms": 100.0, "round_medians_ms": [100.0, 100.0, 100.0]}]
    pair = compare_pairs([first, second], [], rows, None)[0]
    low, high = pair["measured_ratio_interval"]
    assert 1.01 <= low <= 1.03 <= high <= 1.06
    assert "over resampled rounds" in pair_lines([pair])


def test_builds_are_drawn_before_their_rounds() -> None:
    # b is a's equal in its first build and 4% slower in its second, every round (Note
    # [Resampling builds]). Drawn by build, some draws hold only the first build (1.00) and
    # some only the second (1.04); drawn as if alike, the twelve rounds average the two out.
    a = [100.0] * 12
    series = {"a": a, "b": [100.0] * 6 + [104.0] * 6}
    mean = statistics.fmean
    by_build = interval(resampled(series, lambda m: m["b"] / m["a"], summary=mean, builds=2))
    alike = interval(resampled(series, lambda m: m["b"] / m["a"], summary=mean))
    assert by_build == pytest.approx((1.0, 1.04))
    assert alike[0] > 1.005 and alike[1] < 1.035


def test_one_build_draws_as_before_and_uneven_builds_are_refused() -> None:
    series = {"a": [1.0, 2.0, 3.0, 4.0], "b": [2.0, 2.0, 3.0, 5.0]}
    # The draws of the code before builds, pinned: the committed reports' intervals rest on them.
    rng = random.Random(0)
    before = [[rng.randrange(4) for _ in range(4)] for _ in range(3)]
    picked = resampled(series, lambda m: m["a"], draws=3, summary=lambda v: sum(v), builds=1)
    assert picked == [sum(series["a"][i] for i in draw) for draw in before]
    with pytest.raises(ValueError, match="4 rounds are not 3 builds"):
        resampled(series, lambda m: m["b"] / m["a"], builds=3)
