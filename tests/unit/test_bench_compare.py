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


def test_floor_column_and_line() -> None:
    from commsched.bench.compare import bound_lines, markdown_table
    from commsched.bench.validate import floor_summary
    from commsched.sim import FittedNetwork

    # The two tensors of test_sim_floor, the network fitted as alpha 2 ms, beta 10 us/B.
    doc = {"schema_version": 2, "world_size": 2,
           "compute": {"before_first_ready_s": 0.07, "step_s": 0.004},
           "collectives": {"allreduce": {"alpha_s": 0.002, "beta_s_per_byte": 1e-5}},
           "tensors": [{"id": 0, "name": "t0", "numel": 250, "dtype": "float32",
                        "forward_index": 0, "ready_time_s": 0.01, "module": "a"},
                       {"id": 1, "name": "t1", "numel": 750, "dtype": "float32",
                        "forward_index": 1, "ready_time_s": 0.0, "module": "b"}],
           "modules": [{"name": "", "forward_order": 0, "forward_time_s": 0.0,
                        "self_time_s": 0.0},
                       {"name": "a", "forward_order": 1, "forward_time_s": 0.01,
                        "self_time_s": 0.01},
                       {"name": "b", "forward_order": 2, "forward_time_s": 0.05,
                        "self_time_s": 0.05}]}
    assert FittedNetwork.from_document(doc).allreduce_model().beta == pytest.approx(1e-5)
    summary = floor_summary(doc)
    assert summary["floor_ms"] == pytest.approx(102.0)
    assert summary["floor_gap_ms"] == pytest.approx(18.0)
    rows = [{"name": "hvd", "median_ms": 204.0, "p10_ms": 200.0, "p90_ms": 210.0, "vs_hvd": 1.0,
             "vs_torch-ddp": None, "vs_bound": 2.0, "vs_floor": 2.0}]
    assert markdown_table(rows).splitlines()[2].endswith("| 2.000 | 2.000 |")
    bound = {"compute_ms": 84.0, "min_comm_ms": 42.0, "bound_ms": 84.0,
             "hvd_waiting_fraction": 0.5, "floor_from": "commsched:horovod", **summary}
    assert "floor of any cross-iteration schedule (from commsched:horovod's profile): 102.0 ms" \
        in bound_lines(bound)


def test_validation_summary_gives_median_and_worst_error(tmp_path) -> None:
    import json

    from commsched.bench.validate import summary_markdown

    def row(name: str, measured: float, predicted: float) -> dict:
        return {"name": name, "median_ms": measured, "predicted_ms": predicted,
                "prediction_error": abs(predicted - measured) / measured}

    paths = []
    for ranks, rows in ((2, [row("commsched:horovod", 100.0, 104.0)]),
                        (3, [row("commsched:dear", 200.0, 180.0),
                             row("commsched:prophet", 100.0, 101.0)])):
        path = tmp_path / f"{ranks}.json"
        path.write_text(json.dumps({"meta": {"model": "cnn", "world_size": ranks,
                                             "network": "1gbit"}, "bound": {}, "rows": rows}))
        paths.append(str(path))
    text = summary_markdown(paths)
    assert "| cnn, 3 ranks | 1gbit | commsched:dear | 200.0 | 180.0 | 10% | yes |" in text
    assert "Median error 4.0%, worst 10.0%." in text
