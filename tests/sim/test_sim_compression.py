"""The simulator's named compressors (sim/compressed.py), with answers worked out on paper.

Profile: w, a 20 x 30 float32 matrix (2400 B) ready first; b, 20 floats (80 B) ready 2 ms later;
10 ms before the first gradient, a 1 ms update. Network: 2 workers, ring, alpha = 1 ms,
100 kB/s, so all-reduce(n) = 2 ms + n * 10 us and all-gather(n) = 1 ms + n * 5 us.
PowerSGD rank 2: w -> P (20 x 2 = 40 floats, 160 B) and Q (30 x 2 = 60 floats, 240 B); b is
1-D and stays. Top-k 1%: w -> k = 6, b -> k = 1 (4 k <= numel for both).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from commsched.compression import Compression, LossyCompression
from commsched.plan import Block, Collective, Piece, Plan, TensorSpec
from commsched.runtime.compression.gradients import CompressedGradients
from commsched.sim import LinkNetwork, Mode, SimResult, profile_from_document, simulate
from commsched.sim.cli import UsageError, main, parse_compressions
from commsched.sim.compressed import compress_run
from commsched.sim.profile import ProfileError, RunProfile, specs_from_profile
from commsched.sim.timing import CompressorCompute

NET = LinkNetwork(2, 1e5, 1e-3)


def document(compression_s: float | None = 0.003, shapes: bool = True) -> dict:
    compute = {"before_first_ready_s": 0.01, "step_s": 0.001}
    if compression_s is not None:
        compute["compression_s"] = compression_s
    rows = [("w", [20, 30], 0.0), ("b", [20], 0.002)]
    return {"schema_version": 2, "world_size": 2, "compute": compute,
            "tensors": [{"id": i, "name": n, "numel": int(torch.Size(s).numel()),
                         "dtype": "float32", "forward_index": i, "ready_time_s": r,
                         **({"shape": s} if shapes else {})}
                        for i, (n, s, r) in enumerate(rows)]}


def run_of(**kwargs: object) -> RunProfile:
    return profile_from_document(document(**kwargs))  # type: ignore[arg-type]


def test_powersgd_wire_tensors_are_the_runs() -> None:
    lossy = Compression.powersgd(rank=2)
    compressed = compress_run(run_of(), lossy, world=2)
    assert compressed.layout.compressed == frozenset({0})
    assert [(s.tensor_id, s.name, s.numel) for s in compressed.wire_specs] == [
        (2, "w/powersgd.P", 40), (3, "w/powersgd.Q", 60)]
    # The run lays out the same wire tensors for parameters of these shapes.
    params = [torch.zeros(20, 30), torch.zeros(20)]
    real = CompressedGradients(lossy, specs_from_profile(run_of()), params, 2, 0)
    assert real.wire_specs == list(compressed.wire_specs)
    assert compressed.compression_s == 0.003 and compressed.notes == ()


def test_topk_wire_tensors_are_the_runs() -> None:
    lossy = Compression.topk(ratio=0.01)
    compressed = compress_run(run_of(), lossy, world=3)
    # 3 ranks x (6 + 1) entries: 21 float32 values, 21 int32 indices.
    assert [(s.name, s.numel, s.dtype) for s in compressed.wire_specs] == [
        ("topk.values.float32", 21, "float32"), ("topk.indices.float32", 21, "int32")]
    params = [torch.zeros(20, 30), torch.zeros(20)]
    real = CompressedGradients(lossy, specs_from_profile(run_of()), params, 3, 1)
    assert real.wire_specs == list(compressed.wire_specs)


def test_sync_iteration_with_powersgd_compute() -> None:
    # Block 0 = b + P (240 B, 4.4 ms), block 1 = Q (240 B, 4.4 ms). First gradient at 10 ms,
    # backward ends at 12 ms (b); block 0 runs 12-16.4 ms; the compressor's 3 ms start when it
    # is done: 16.4-19.4 ms; Q's block 19.4-23.8 ms; the update 23.8-24.8 ms.
    compressed = compress_run(run_of(), Compression.powersgd(rank=2), world=2)
    plan = Plan("test", (Block(0, (Piece(1, 0, 20), Piece(2, 0, 40)), "float32"),
                         Block(1, (Piece(3, 0, 60),), "float32")))
    compute = CompressorCompute(0.003, compressed.waited_for, compressed.after_compute)
    result = simulate(compressed.run, plan, NET, Mode.SYNC, compressor=compute)
    assert result.iteration_s == pytest.approx(0.0248)
    spans = [(e.lane, e.name, round(e.start_s, 9), round(e.end_s, 9)) for e in result.events]
    assert ("compute", "compress", 0.0164, 0.0194) in spans
    assert ("network", "allreduce", 0.0194, 0.0238) in spans
    assert [s[2:] for s in spans if s[0] == "wait"] == [(0.012, 0.0164), (0.0194, 0.0238)]
    assert result.wire_bytes == pytest.approx(480)  # ring, 2 ranks: each sends n bytes


def one_block_each(specs: list[TensorSpec], profile: object) -> Plan:
    return Plan("test", tuple(Block(i, (Piece(s.tensor_id, 0, s.numel),), s.dtype)
                              for i, s in enumerate(specs)))


def test_topk_gather_waits_for_the_compute() -> None:
    # Top-k, 2 ranks: 14 values (56 B) and 14 indices (56 B), one all-gather block per dtype,
    # 1 ms + 56 x 5 us = 1.28 ms each, offered when the 3 ms compute after backward (12 ms)
    # ends: 15-16.28 and 16.28-17.56 ms; then the update: 18.56 ms.
    compressed = compress_run(run_of(), Compression.topk(ratio=0.01), world=2)
    plan = compressed.plan(one_block_each)
    assert [(b.op, b.dtype) for b in plan.blocks] == [(Collective.ALL_GATHER, "float32"),
                                                      (Collective.ALL_GATHER, "int32")]
    compute = CompressorCompute(0.003, compressed.waited_for, compressed.after_compute)
    result = simulate(compressed.run, plan, NET, Mode.SYNC, compressor=compute)
    assert result.iteration_s == pytest.approx(0.01856)
    network = [(round(e.start_s, 9), round(e.end_s, 9)) for e in result.events
               if e.lane == "network"]
    assert network == [(0.015, 0.01628), (0.01628, 0.01756)]


def test_estimate_without_measured_compute() -> None:
    powersgd = compress_run(run_of(compression_s=None), Compression.powersgd(rank=2), 2)
    assert powersgd.compression_s == pytest.approx(6 * 20 * 30 * 2 / 1e10)
    assert "compression_s missing: estimated" in powersgd.notes[0]
    topk = compress_run(run_of(compression_s=None), Compression.topk(ratio=0.01), 2)
    assert topk.compression_s == pytest.approx(620 * 4e-9)


def test_tensor_without_shape_is_taken_as_the_squarest_matrix() -> None:
    # 600 = 24 x 25: P 24 x 2, Q 25 x 2.
    compressed = compress_run(run_of(shapes=False), Compression.powersgd(rank=2), 2)
    assert [s.numel for s in compressed.wire_specs] == [48, 50]
    assert any("squarest" in n for n in compressed.notes)


def test_profile_shape_must_match_numel() -> None:
    doc = document()
    doc["tensors"][0]["shape"] = [20, 31]
    with pytest.raises(ProfileError, match=r"tensors\[0\] \('w'\)\.shape"):
        profile_from_document(doc)


def test_compression_axis_parsing() -> None:
    values = parse_compressions("1, 2.5,powersgd:4,topk:0.01")
    assert values[:2] == [1.0, 2.5]
    assert values[2] == Compression.powersgd(rank=4) and values[3] == Compression.topk(0.01)
    for bad, said in (("powersgd:0", "rank"), ("topk:2", "ratio"), ("zip:3", "powersgd:RANK"),
                      ("0.5", "between 1")):
        with pytest.raises(UsageError, match=said):
            parse_compressions(bad)


def test_cli_rows_of_a_named_compressor(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(document()))
    out = tmp_path / "rows.json"
    assert main(["--profile", str(profile), "--workers", "2", "--bandwidth", "800kbit",
                 "--latency", "1ms", "--policy", "horovod,ddp", "--knobs", "default",
                 "--compression", "1,powersgd:2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["models"][str(profile)]["rows"]
    assert [(r["compression"], r["policy"]) for r in rows] == [
        (1.0, "horovod"), (1.0, "ddp"), ("powersgd(rank=2)", "horovod"),
        ("powersgd(rank=2)", "ddp")]
    # Uncompressed: 2480 B on the wire per rank; PowerSGD: b + P + Q = 480 B.
    assert rows[2]["utilisation"] == pytest.approx(480 / (rows[2]["iteration_s"] * 1e5))
    assert rows[0]["utilisation"] == pytest.approx(2480 / (rows[0]["iteration_s"] * 1e5))
    assert rows[2]["compression_for_target"] is None
    assert rows[2]["iteration_s"] < rows[0]["iteration_s"]


def test_validation_predicts_a_compressed_run_from_its_profile() -> None:
    # The bench's prediction for a compressed candidate: its profile (no shapes: the profiler
    # writes none; the model's are added), its installed plan, its fitted network (alpha 2 ms,
    # 10 us per byte: the numbers of the timeline above, 24.8 ms).
    from benchmarks.harness.measured_vs_predicted import predict_ms
    from commsched.config import Policy

    doc = document(shapes=False)
    doc["collectives"] = {"allreduce": {"alpha_s": 0.002, "beta_s_per_byte": 1e-5}}
    plan = Plan("test", (Block(0, (Piece(1, 0, 20), Piece(2, 0, 40)), "float32"),
                         Block(1, (Piece(3, 0, 60),), "float32")))
    shapes = {"w": (20, 30), "b": (20,)}
    assert predict_ms(doc, plan, Policy.HOROVOD, Compression.powersgd(rank=2), shapes) == \
        pytest.approx(24.8)


def test_fitted_network_with_a_named_compressor(tmp_path: Path) -> None:
    doc = document()
    doc["collectives"] = {"allreduce": {"alpha_s": 0.002, "beta_s_per_byte": 1e-5}}
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(doc))
    out = tmp_path / "rows.json"
    assert main(["--profile", str(profile), "--fitted", "--policy", "horovod", "--knobs",
                 "default", "--compression", "powersgd:2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["models"][str(profile)]["rows"]
    assert [(r["compression"], r["workers"]) for r in rows] == [(1.0, 2),
                                                               ("powersgd(rank=2)", 2)]
    # Uncompressed, horovod's plan sends b and w (2480 B, >= 26.8 ms of all-reduce); PowerSGD
    # sends 480 B in two rounds (8.8 ms) plus its 3 ms.
    assert rows[1]["iteration_s"] < rows[0]["iteration_s"]


def overlap_document() -> dict:
    """document() with modules: w's first user runs first (1 ms), b's second (1 ms), and an
    update call costs 0.5 ms."""
    doc = document()
    doc["compute"].update({"update_fixed_s": 0.0005, "update_per_byte_s": 0.0})
    doc["modules"] = [{"name": "", "forward_order": 0, "forward_time_s": 0.002},
                      {"name": "first", "forward_order": 1, "forward_time_s": 0.001},
                      {"name": "second", "forward_order": 2, "forward_time_s": 0.001}]
    for row, module in zip(doc["tensors"], ("first", "second"), strict=True):
        row["module"] = module
    return doc


def simulate_overlap(lossy: LossyCompression) -> SimResult:
    """overlap_document() under `lossy`, one block per tensor, in overlap mode."""
    compressed = compress_run(profile_from_document(overlap_document()), lossy, world=2)
    plan = compressed.plan(one_block_each)
    return simulate(compressed.run, plan, NET, Mode.OVERLAP, compressor=compressed.compute)


def spans_of(result: SimResult) -> list[tuple[str, str, float, float]]:
    return sorted((e.lane, e.name, round(e.start_s * 1e3, 6), round(e.end_s * 1e3, 6))
                  for e in result.events)


def test_overlap_iteration_with_powersgd() -> None:
    """Under an overlap plan the compressor's time is at step(), after the first round's
    blocks; the second round goes on the wire then, and the next forward's group that updates
    w waits for it (Note [Compression under an overlap plan]). In ms from the end of the
    previous step(): Q's block (240 B, 4.4) runs 0-4.4; "first" waits for it, updates w
    (0.5), runs (1); "second" updates b (its block was done last iteration, 0.5) and runs (1):
    7.4; the rest of before_first_ready_s (10 - 2 of forward): first gradient at 15.4, b at
    17.4; b's block (80 B, 2.8) 17.4-20.2, then P's (160 B, 3.6) 20.2-23.8, which step()
    waits for; the compressor's 3 ms end the iteration at 26.8."""
    result = simulate_overlap(Compression.powersgd(rank=2))
    assert result.iteration_s == pytest.approx(0.0268)
    spans = spans_of(result)
    for span in [("network", "allreduce", 0.0, 4.4), ("wait", "first", 0.0, 4.4),
                 ("compute", "update", 4.4, 4.9), ("compute", "update", 5.9, 6.4),
                 ("network", "allreduce", 17.4, 20.2), ("network", "allreduce", 20.2, 23.8),
                 ("wait", "step", 17.4, 23.8), ("compute", "compress", 23.8, 26.8)]:
        assert span in spans, (span, spans)


def test_overlap_iteration_with_topk() -> None:
    """Top-k has no first round: step() computes for 3 ms after backward (2 ms after the
    first gradient at 13.56), and its two all-gathers (1.28 ms each) run at the start of the
    next iteration, where w's group waits for both: 2.56."""
    result = simulate_overlap(Compression.topk(ratio=0.01))
    assert result.iteration_s == pytest.approx(0.01856)
    spans = spans_of(result)
    for span in [("network", "all_gather", 0.0, 1.28), ("network", "all_gather", 1.28, 2.56),
                 ("wait", "first", 0.0, 2.56), ("compute", "compress", 15.56, 18.56)]:
        assert span in spans, (span, spans)


def test_auto_ranks_only_compressed_candidates_when_asked() -> None:
    from commsched.config import load_config
    from commsched.sim import rank_candidates

    run = profile_from_document(overlap_document())
    cfg = load_config({"policy": "auto"}, environ={})
    compressed = compress_run(run, Compression.powersgd(rank=2), world=2)
    ranked = rank_candidates(run, NET, cfg, True, compressed)
    assert {r.policy.value for r in ranked} >= {"bytescheduler", "dear", "horovod"}
    assert all(r.plan.policy.endswith("+powersgd(rank=2)") for r in ranked)
    plain = rank_candidates(run, NET, cfg, True)
    assert not any("powersgd" in r.plan.policy for r in plain)
