"""The benchmark harness's arithmetic (no processes)."""

from __future__ import annotations

import pytest

from commsched.bench.compare import iteration_times, parse_candidate


def test_iteration_time_follows_the_slowest_rank_not_per_step_maxima() -> None:
    # Two ranks, one round: the untimed step's end, then three timed steps. Rank 0 waits in
    # step 1, rank 1 in step 2; each rank's own durations are [1, 3, 1] and [3, 1, 1] seconds.
    rank0 = [[0.0, 1.0, 4.0, 5.0]]
    rank1 = [[0.0, 3.0, 4.0, 5.0]]
    assert iteration_times([rank0, rank1]) == pytest.approx([3.0, 1.0, 1.0])
    # Per-step maxima would claim 3 + 3 + 1 = 7 s for what took 5 s.


def test_iteration_times_do_not_span_rounds() -> None:
    rank0 = [[0.0, 1.0, 2.0], [10.0, 12.0]]
    assert iteration_times([rank0]) == pytest.approx([1.0, 1.0, 2.0])


def test_parse_candidate() -> None:
    assert parse_candidate("commsched:prophet?partition_bytes=1MiB&credit_bytes=0") == \
        ("prophet", {"partition_bytes": "1MiB", "credit_bytes": "0"})
    assert parse_candidate("commsched:mgwfbp") == ("mgwfbp", {})
