"""benchmarks.harness.cross_size: a profile of one number of ranks predicts another on the same
shared loopback (issue 55, item 4's validation rows), and the committed report
(benchmarks/scale/cross_size/) is what scripts/cross_size_report.py computes from the committed
jobs."""

from __future__ import annotations

import json
import pathlib

import pytest
from script_modules import load_script

from benchmarks.harness.cross_size import predict_on, rescaled_document, shared_link_factor
from commsched.config import Policy
from commsched.plan import Collective
from commsched.sim import FittedNetwork

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESNET = ROOT / "benchmarks/real/resnet50/all"
# A dear profile of the CNN on 2 ranks: it has fits of all three collectives.
CNN = ROOT / "benchmarks/sim_validation/cnn-1gbit"


def _document(job: pathlib.Path) -> dict:
    return json.loads((job / "floor_profile.json").read_text(encoding="utf-8"))


def test_a_shared_link_takes_n_minus_one_times_as_long() -> None:
    assert shared_link_factor(2, 3) == 2.0
    assert shared_link_factor(3, 2) == 0.5
    assert shared_link_factor(2, 8) == 7.0
    with pytest.raises(ValueError, match="2 or more ranks"):
        shared_link_factor(1, 3)


def test_rescaling_matches_what_a_shared_ring_moves() -> None:
    """On n ranks sharing a link, each phase of a ring collective of S bytes carries (n-1)/n of
    S from each of n ranks, (n-1) S in all: from 2 ranks to 3, twice the time. The
    reduce-scatter's fit is per byte of a shard (S/n), so its per-byte cost grows by
    (n1-1) n1 / ((n0-1) n0) for the whole buffer to take twice as long."""
    ends = sorted((CNN / "predict").glob("candidate*-end.json"))
    dear = next(e for e in (json.loads(p.read_text(encoding="utf-8")) for p in ends)
                if "reduce_scatter" in e["profile"]["collectives"])
    document = dear["profile"]
    assert document["world_size"] == 2
    before = FittedNetwork.from_document(document)
    after = FittedNetwork.from_document(rescaled_document(document, 3))
    assert after.world_size == 3
    buffer = 64 << 20
    for op in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        ratio = after.time(op, buffer) / before.time(op, buffer)
        assert ratio == pytest.approx(2.0, rel=1e-3), op
    assert "samples" not in rescaled_document(document, 3)["collectives"]["reduce_scatter"]
    assert "samples" in document["collectives"]["reduce_scatter"]  # the input is left alone
    resnet = _document(RESNET)  # prophet's: all-reduces only
    ratio = (FittedNetwork.from_document(rescaled_document(resnet, 3)).time(Collective.ALLREDUCE,
                                                                             buffer)
             / FittedNetwork.from_document(resnet).time(Collective.ALLREDUCE, buffer))
    assert ratio == pytest.approx(2.0, rel=1e-3)


def test_a_sharded_profile_is_sharded_among_the_new_ranks() -> None:
    """shard_optimizer: each of n0 ranks stepped 1/n0 of the parameters (step_s), each of n1
    ranks steps 1/n1 of them; the whole update (what the simulator reads) stays."""
    ends = sorted((ROOT / "benchmarks/sim_validation/sharded-cnn-1gbit/predict")
                  .glob("candidate*-end.json"))
    sharded = next(e["profile"] for e in (json.loads(p.read_text(encoding="utf-8"))
                                          for p in ends)
                   if e["profile"].get("update_shards", 1) > 1)
    assert sharded["update_shards"] == 2
    three = rescaled_document(sharded, 3)
    assert three["update_shards"] == 3
    assert three["compute"]["step_s"] * 3 == pytest.approx(sharded["compute"]["step_s"] * 2)
    plain = _document(RESNET)
    assert "update_shards" not in rescaled_document(plain, 3)
    assert rescaled_document(plain, 3)["compute"] == plain["compute"]


def test_a_prediction_on_the_profiles_own_size_is_not_rescaled() -> None:
    document = _document(RESNET)
    results = json.loads((RESNET / "results.json").read_text(encoding="utf-8"))
    allreduce_ms = results["bound"]["min_comm_ms"]
    knobs = {"partition_bytes": "2MiB", "credit_bytes": "4MiB"}
    own = predict_on(document, Policy.BYTESCHEDULER, knobs, 2, allreduce_ms)
    measured = next(row["median_ms"] for row in results["rows"]
                    if row["name"].startswith("commsched:bytescheduler"))
    assert own == pytest.approx(measured, rel=0.15)
    # Communication-bound on 3 ranks: twice the traffic on the one link, the compute kept.
    three = predict_on(document, Policy.HOROVOD, {}, 3, allreduce_ms)
    two = predict_on(document, Policy.HOROVOD, {}, 2, allreduce_ms)
    assert 1.5 * two < three < 2.0 * two


def test_the_committed_report_is_computed_from_the_committed_jobs() -> None:
    report = load_script("cross_size_report")
    assert report.main(["--check"]) == 0, (
        "benchmarks/scale/cross_size/results.json differs: run .venv/bin/python "
        "scripts/cross_size_report.py")
    committed = json.loads((ROOT / report.OUT / "results.json").read_text(encoding="utf-8"))
    sizes = {(pair["ranks_from"], pair["ranks_to"]) for pair in committed["pairs"]}
    assert sizes == {(2, 3), (3, 2)}
    assert all(pair["rows"] for pair in committed["pairs"])


def test_other_jobs_are_paired_from_the_command_line(tmp_path: pathlib.Path) -> None:
    """scripts/device_scale.sh passes its 4- and 8-rank jobs with --pair: the same rows as the
    committed report's for the same pair, and a README that names the link."""
    report = load_script("cross_size_report")
    label, fewer, more, profiles = next(pair for pair in report.PAIRS if pair[3] != "floor")
    out = tmp_path / "cross_size"
    assert report.main(["--pair", label, fewer, more, profiles, "--out", str(out),
                        "--command", "device_scale.sh"]) == 0
    written = json.loads((out / "results.json").read_text(encoding="utf-8"))
    committed = json.loads((ROOT / report.OUT / "results.json").read_text(encoding="utf-8"))
    assert written["command"] == "device_scale.sh"
    assert written["pairs"] == [pair for pair in committed["pairs"] if pair["model"] == label]
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "Link: loopback shaped to 1gbit" in readme
