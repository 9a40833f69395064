"""The benchmark harness's arithmetic (no processes)."""

from __future__ import annotations

import time

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


def two_tensor_document(before_first_ready_s: float = 0.07) -> dict:
    """The two tensors of test_sim_floor, the network fitted as alpha 2 ms, beta 10 us/B."""
    return {"schema_version": 2, "world_size": 2,
            "compute": {"before_first_ready_s": before_first_ready_s, "step_s": 0.004},
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


def test_floor_column_and_line() -> None:
    from benchmarks.harness.measured_vs_predicted import floor_summary
    from commsched.bench.compare import bound_lines, markdown_table
    from commsched.sim import FittedNetwork

    doc = two_tensor_document()
    assert FittedNetwork.from_document(doc).allreduce_model().beta == pytest.approx(1e-5)
    summary = floor_summary(doc)
    assert summary["floor_ms"] == pytest.approx(102.0)
    assert summary["floor_gap_ms"] == pytest.approx(18.0)
    # Calibrated to a measured all-reduce of all 4000 B in 82 ms: beta = 20 us/B, and the
    # window of both tensors needs 70 - 10 + 2 + 80 = 142 ms.
    assert floor_summary(doc, 82.0)["floor_ms"] == pytest.approx(142.0)
    rows = [{"name": "hvd", "median_ms": 204.0, "p10_ms": 200.0, "p90_ms": 210.0, "vs_hvd": 1.0,
             "vs_torch-ddp": None, "vs_bound": 2.0, "vs_floor": 2.0}]
    assert markdown_table(rows).splitlines()[2].endswith("| 2.000 | 2.000 |")
    bound = {"compute_ms": 84.0, "min_comm_ms": 42.0, "bound_ms": 84.0,
             "hvd_waiting_fraction": 0.5, "floor_from": "commsched:horovod", **summary}
    assert ("floor of any cross-iteration schedule (the lowest over the candidates' profiles: "
            "commsched:horovod's): 102.0 ms") in bound_lines(bound)


def test_floor_is_the_lowest_over_the_candidates_profiles() -> None:
    # Each profile measured compute under its own candidate's traffic; a floor must hold for
    # every candidate, so the report takes the lowest (and never below the naive bound).
    from benchmarks.harness.compare_predict import PredictionInput, add_floor
    from commsched.bench.candidate import Candidate
    from commsched.config import Policy

    def item(index: int, name: str, doc: dict) -> PredictionInput:
        return PredictionInput(index, Candidate(name, step=lambda _: None), Policy.BYTESCHEDULER,
                               doc, None, {})

    slow, quick = two_tensor_document(0.09), two_tensor_document(0.07)
    inputs = [item(1, "commsched:bytescheduler", slow), item(2, "commsched:dear", quick)]
    rows = [{"name": "commsched:dear", "median_ms": 120.0}]
    bound: dict = {"min_comm_ms": None, "bound_ms": 84.0}
    assert add_floor(rows, bound, inputs) is quick
    assert bound["floor_from"] == "commsched:dear"
    assert bound["floor_ms"] == pytest.approx(102.0)  # test_floor_column_and_line's profile
    assert rows[0]["vs_floor"] == pytest.approx(120.0 / 102.0)
    bound = {"min_comm_ms": None, "bound_ms": 150.0}
    add_floor(rows, bound, inputs)
    assert bound["floor_ms"] == 150.0  # never below the naive bound


def test_prediction_is_no_faster_than_the_measured_bulk_rate() -> None:
    # One block of both tensors (4000 B, 2 ranks): ready at 70 + 10 ms, fitted at 2 ms + 40 ms,
    # then the 4 ms step: 126 ms. The job's all-reduce of all 4000 B measured 82 ms, so the
    # block cannot take less (Note [No faster than the link's bulk rate]): 166 ms. In a world
    # of one (0 ms measured) the fit stands.
    from benchmarks.harness.measured_vs_predicted import predict_ms
    from commsched.config import Policy
    from commsched.plan import Block, Piece, Plan

    doc = two_tensor_document()
    plan = Plan("test", (Block(0, (Piece(0, 0, 250), Piece(1, 0, 750)), "float32"),))
    assert predict_ms(doc, plan, Policy.HOROVOD) == pytest.approx(126.0)
    assert predict_ms(doc, plan, Policy.HOROVOD, allreduce_all_ms=82.0) == pytest.approx(166.0)
    assert predict_ms(doc, plan, Policy.HOROVOD, allreduce_all_ms=30.0) == pytest.approx(126.0)
    assert predict_ms(doc, plan, Policy.HOROVOD, allreduce_all_ms=0.0) == pytest.approx(126.0)


def test_an_iteration_is_slowed_to_the_bulk_rate_as_a_whole() -> None:
    # Two blocks: t0 (1000 B, fitted 12 ms) and t1 (3000 B, 32 ms): 44 ms for 4000 wire bytes
    # that the link carries in 82 ms in bulk. Both blocks are slowed by 82/44, the small one
    # too: one block may beat the bulk rate, the iteration may not.
    from commsched.plan import Block, Piece, Plan
    from commsched.sim import FittedNetwork, profile_from_document
    from commsched.sim.channel import at_bulk_rate, block_times

    doc = two_tensor_document()
    run, fitted = profile_from_document(doc), FittedNetwork.from_document(doc)
    plan = Plan("test", (Block(0, (Piece(1, 0, 750),), "float32"),
                         Block(1, (Piece(0, 0, 250),), "float32")))
    slowed = at_bulk_rate(run, plan, fitted, 82e-3 / 4000)
    assert block_times(run, plan, slowed).durations == pytest.approx([32e-3 * 82 / 44,
                                                                      12e-3 * 82 / 44])
    assert at_bulk_rate(run, plan, fitted, 40e-3 / 4000) is fitted  # fits slower than bulk


def test_validation_summary_gives_median_and_worst_error(tmp_path) -> None:
    import json

    from benchmarks.harness.sim_validation import summary_markdown

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


def test_auto_verdict_weighs_autos_own_median_against_the_fastest() -> None:
    """auto may pick the fastest policy and run slower (other knobs), or another policy and
    run as fast: both the pick and the ratio of medians are reported."""
    from benchmarks.harness.measured_vs_predicted import auto_verdict
    from benchmarks.harness.prediction_report import auto_line

    rows = [{"name": "hvd", "median_ms": 50.0},
            {"name": "commsched:dear?fusion_threshold=4MiB", "median_ms": 100.0},
            {"name": "commsched:bytescheduler", "median_ms": 110.0},
            {"name": "commsched:auto", "median_ms": 101.5}]
    summary = {"policy": "bytescheduler", "knobs": {"partition_bytes": 1}, "predicted_s": 0.1}
    verdict = auto_verdict(rows, "commsched:auto", summary)
    assert verdict["measured_fastest"] == "commsched:dear?fusion_threshold=4MiB"
    assert not verdict["picked_fastest"]
    assert verdict["auto_vs_fastest"] == pytest.approx(1.015)
    assert verdict["auto_within_tolerance"]
    assert "1.015x the fastest other commsched candidate (100.0 ms): within 2%: yes" in \
        auto_line(verdict)
    # A control (Note [A control candidate]) is no other candidate to beat.
    control = auto_verdict(rows[:-1] + [{"name": "commsched:dear?fusion_threshold=4MiB#control",
                                         "median_ms": 90.0}] + rows[-1:], "commsched:auto",
                           summary)
    assert control["measured_fastest"] == "commsched:dear?fusion_threshold=4MiB"
    rows[-1]["median_ms"] = 103.0
    verdict = auto_verdict(rows, "commsched:auto", summary)
    assert not verdict["auto_within_tolerance"]
    assert "within 2%: no" in auto_line(verdict)
    assert "trial windows" not in auto_line(verdict)  # no trials in its history


def test_auto_verdict_shows_the_trial_windows_autos_choice_rested_on() -> None:
    from benchmarks.harness.measured_vs_predicted import auto_verdict
    from benchmarks.harness.prediction_report import auto_line

    def window(policy: str, seconds: float | None, why: str = "trial") -> dict:
        return {"policy": policy, "knobs": {}, "predicted_s": 0.1, "measured_s": seconds,
                "why": why}

    history = [window("dear", 0.130, "choice"), window("horovod", 0.1104), window("dear", 0.1001),
               window("horovod", 0.1112), window("dear", 0.0995), window("dear", 0.1, "kept")]
    rows = [{"name": "commsched:horovod", "median_ms": 110.0},
            {"name": "commsched:auto", "median_ms": 100.0}]
    ranking = [("dear", {}, 0.1), ("dear", {"fusion_threshold": 1}, 0.101),
               ("horovod", {}, 0.12)]
    verdict = auto_verdict(rows, "commsched:auto", {"policy": "dear", "knobs": {},
                                                    "history": history, "ranking": ranking})
    assert verdict["auto_ranking"] == {"dear {}": 100.0, "horovod {}": 120.0}
    assert "the best of each policy (predicted ms): dear {} 100.0, horovod {} 120.0" in \
        auto_line(verdict)
    # The choice's check (130 ms) and the closing entry are no trial windows.
    assert verdict["auto_trials"] == {"horovod {}": [110.4, 111.2], "dear {}": [100.1, 99.5]}
    assert "its trial windows (ms): horovod {} 110.4/111.2, dear {} 100.1/99.5" in \
        auto_line(verdict)


def test_each_compressed_auto_is_weighed_against_its_own_compressor() -> None:
    """auto never changes the compressor it was given: auto with top-k is compared with the
    top-k candidates only, and each auto of a job gets its own line."""
    from benchmarks.harness.measured_vs_predicted import auto_verdict
    from benchmarks.harness.prediction_report import auto_line

    psgd, topk = "compression=powersgd&powersgd_rank=4", "compression=topk&topk_ratio=0.01"
    rows = [{"name": f"commsched:ddp?{psgd}", "median_ms": 130.0},
            {"name": f"commsched:dear?{psgd}", "median_ms": 150.0},
            {"name": f"commsched:ddp?{topk}", "median_ms": 145.0},
            {"name": f"commsched:bytescheduler?{topk}", "median_ms": 160.0},
            {"name": f"commsched:auto?{psgd}", "median_ms": 152.0},
            {"name": f"commsched:auto?{topk}", "median_ms": 146.0}]
    summary = {"policy": "ddp", "knobs": {}, "predicted_s": 0.14}
    verdicts = [auto_verdict(rows, f"commsched:auto?{c}", summary) for c in (psgd, topk)]
    assert [v["measured_fastest"] for v in verdicts] == [f"commsched:ddp?{psgd}",
                                                         f"commsched:ddp?{topk}"]
    assert [v["auto_within_tolerance"] for v in verdicts] == [False, True]
    text = auto_line(verdicts)
    assert text.count("picked ddp") == 2
    assert f"`commsched:auto?{topk}` picked" in text


# -- compression candidates (commsched.bench.compressed_candidates) ---------------------------

def test_ddp_powersgd_candidate_parsing() -> None:
    from commsched.bench.compressed_candidates import DdpPowerSGD, parse_ddp_powersgd

    assert parse_ddp_powersgd("torch-ddp") is None
    assert parse_ddp_powersgd("torch-ddp-powersgd") == DdpPowerSGD(4, 2, 2.0)
    assert parse_ddp_powersgd("torch-ddp-powersgd?rank=1&start_iter=5&min_rate=1.5") == \
        DdpPowerSGD(1, 5, 1.5)
    for bad, said in (("torch-ddp-powersgd?rnk=2", "unknown setting 'rnk'"),
                      ("torch-ddp-powersgd?rank=x", "rank='x'"),
                      ("torch-ddp-powersgd?start_iter=1", "start_iter >= 2")):
        with pytest.raises(ValueError, match=said):
            parse_ddp_powersgd(bad)


def test_commsched_compression_knobs_become_the_compressor() -> None:
    from commsched.bench.compressed_candidates import split_compression
    from commsched.compression import Compression, NoneCompressor
    from commsched.config import ConfigError

    _, knobs = parse_candidate("commsched:horovod?compression=powersgd&powersgd_rank=4"
                               "&fusion_threshold=4MiB")
    compression, rest = split_compression(knobs)
    assert compression == Compression.powersgd(rank=4)
    assert rest == {"fusion_threshold": "4MiB"}
    assert split_compression({"compression": "topk", "topk_ratio": "0.1"})[0] == \
        Compression.topk(ratio=0.1)
    assert split_compression({"compression": "none"})[0] is NoneCompressor
    assert split_compression({"credit_bytes": "0"}) == (None, {"credit_bytes": "0"})
    with pytest.raises(ConfigError, match="powersgd_rank"):
        split_compression({"compression": "powersgd", "powersgd_rank": "0"})


# A model's gradients: w 20 x 30 float32 (600), b 20 (1-D), c 2 x 3 x 4 (n 2, m 12).
SHAPES = [((20, 30), 4), ((20,), 4), ((2, 3, 4), 4)]


def test_bytes_per_iteration_hvd_and_ddp_powersgd() -> None:
    from commsched.bench.compressed_candidates import DdpPowerSGD, ddp_powersgd_bytes, hvd_bytes

    # 644 floats: 2576 B, or 1288 B as fp16; 2 ranks on a ring send 2 x 1/2 of the buffer.
    assert hvd_bytes(SHAPES, 2).payload == 2576 and hvd_bytes(SHAPES, 2).sent == 2576
    assert hvd_bytes(SHAPES, 2, fp16=True).payload == 1288
    assert hvd_bytes(SHAPES, 4).sent == pytest.approx(2576 * 1.5)
    # Rank 2: w -> (20 + 30) x 2 = 100 floats (100 x 2 x 2 < 600); b stays (20); c: r = 2,
    # (2 + 12) x 2 x 2 = 56 >= 24, stays (24). 144 floats = 576 B.
    assert ddp_powersgd_bytes(SHAPES, 2, DdpPowerSGD(rank=2)).payload == 576
    # Rank 4: w: 200 x 2 = 400 < 600 -> 200 floats; 244 floats = 976 B.
    assert ddp_powersgd_bytes(SHAPES, 2, DdpPowerSGD(rank=4)).payload == 976


def test_bytes_per_iteration_of_commsched_plans() -> None:
    from commsched.bench.compressed_candidates import plan_bytes
    from commsched.plan import Block, Collective, Piece, Plan

    # One all-reduce of 144 floats (b, P, Q of the test above) and top-k's two all-gathered
    # tensors of 3 ranks x 7 entries (float32 values, int32 indices).
    plan = Plan("x", (Block(0, (Piece(1, 0, 20), Piece(3, 0, 40), Piece(4, 0, 60),
                                Piece(2, 0, 24)), "float32"),
                      Block(1, (Piece(5, 0, 21),), "float32", Collective.ALL_GATHER),
                      Block(2, (Piece(6, 0, 21),), "int32", Collective.ALL_GATHER)))
    wire = plan_bytes(plan, 3)
    # Payload: 576 B all-reduced + this rank's 7 x 4 B of each gathered tensor.
    assert wire.payload == pytest.approx(576 + 28 + 28)
    # Sent on a ring of 3: 2 x 2/3 x 576 + 2/3 x (84 + 84).
    assert wire.sent == pytest.approx(768 + 112)


def test_compression_targets_lines() -> None:
    from benchmarks.harness.compression_targets import targets

    rows = [{"name": "hvd", "median_ms": 100.0},
            {"name": "torch-ddp-powersgd?rank=4", "median_ms": 50.0},
            {"name": "commsched:horovod?compression=powersgd&powersgd_rank=4", "median_ms": 48.0},
            {"name": "commsched:mgwfbp?compression=powersgd&powersgd_rank=4", "median_ms": 40.0},
            {"name": "commsched:horovod?compression=topk&topk_ratio=0.01", "median_ms": 70.0}]
    assert targets(rows) == [
        "* commsched:mgwfbp?compression=powersgd&powersgd_rank=4 / torch-ddp-powersgd?rank=4: "
        "0.80x (target <= 0.9x: met)",
        "* commsched:mgwfbp?compression=powersgd&powersgd_rank=4 / hvd: 0.40x "
        "(target <= 0.6x: met)",
        "* commsched:horovod?compression=topk&topk_ratio=0.01 / torch-ddp-powersgd?rank=4: 1.40x",
        "* commsched:horovod?compression=topk&topk_ratio=0.01 / hvd: 0.70x"]


def test_predict_simulates_every_commsched_candidate_without_a_profile_folder(tmp_path) -> None:
    # World of one, in-process: --predict alone (no folder for profiles, so the report's
    # command has no path of this machine in it) still gives each commsched candidate a
    # prediction; others get none.
    import json

    from benchmarks.harness import compare_predict

    out = tmp_path / "out"
    assert compare_predict.main(["--model", "mlp", "--candidates",
                                 "local (no comm),commsched:horovod", "--warmup", "12",
                                 "--rounds", "1", "--steps", "3", "--predict",
                                 "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert rows["commsched:horovod"]["predicted_ms"] > 0
    assert rows["local (no comm)"].get("predicted_ms") is None
    # Each candidate's own share of busy cores, over its timed steps only; none where those
    # took less than one tick of /proc/stat's clock (these take about a millisecond).
    assert all(row["cpu_busy"] is None or 0 <= row["cpu_busy"] <= 1 for row in rows.values())
    assert "--predict " in report["meta"]["command"]
    assert list(out.iterdir()) and not any(p.name.startswith("candidate") for p in out.iterdir())


def test_predict_dir_keeps_what_each_prediction_was_made_from(tmp_path) -> None:
    # World of one, in-process: candidate<N>-end.json holds the end-of-run profile, the
    # installed plan and the simulated policy, and simulating them again gives the report's
    # prediction, so a change to the fit or the simulator can be checked on a kept run.
    import json

    from benchmarks.harness import compare_predict
    from benchmarks.harness.measured_vs_predicted import predict_ms
    from commsched.config import Policy
    from commsched.plan.serialize import plan_from_dict

    out, kept = tmp_path / "out", tmp_path / "profiles"
    assert compare_predict.main(["--model", "mlp", "--candidates",
                                 "local (no comm),commsched:mgwfbp", "--warmup", "12",
                                 "--rounds", "1", "--steps", "3", "--predict-dir", str(kept),
                                 "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    predicted = {row["name"]: row["predicted_ms"] for row in report["rows"]}
    assert sorted(p.name for p in kept.iterdir()) == ["candidate1-end.json", "candidate1.json"]
    saved = json.loads((kept / "candidate1-end.json").read_text())
    assert saved["candidate"] == "commsched:mgwfbp" and saved["policy"] == "mgwfbp"
    shapes = {name: tuple(shape) for name, shape in saved["shapes"].items()}
    again = predict_ms(saved["profile"], plan_from_dict(saved["plan"]), Policy(saved["policy"]),
                       None, shapes, saved["allreduce_all_ms"])
    assert again == pytest.approx(predicted["commsched:mgwfbp"], rel=1e-9)


def test_a_cpu_tally_adds_up_only_the_stretches_it_measured() -> None:
    from commsched.bench.cpu_meter import CpuTally

    tally = CpuTally()
    assert tally.fraction() is None
    with pytest.raises(RuntimeError, match="without start"):
        tally.stop()
    for _ in range(2):
        tally.start()
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:  # this process keeps a core busy
            pass
        tally.stop()
    busy = tally.fraction()
    assert busy is not None and 0 < busy <= 1
    assert tally.total > 0
