"""benchmarks/harness/zoo_report.py and the zoo job of bench_jobs.py: what the report reads from
each architecture's run, and which targets it says were missed."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks.harness import bench_jobs, driver, zoo_report


def _row(name: str, median: float, hvd: float = 100.0) -> dict:
    return {"name": name, "median_ms": median, "vs_hvd": median / hvd,
            "round_medians_ms": [median * 0.98, median, median * 1.02]}


def _document(medians: dict[str, float], floor: float | None = 60.0) -> dict:
    return {"meta": {"network": "loopback shaped to 1gbit", "cpu_busy_timed": 0.97},
            "bound": {"floor_ms": floor, "hvd_waiting_fraction": 0.5},
            "rows": [_row(name, median) for name, median in medians.items()]}


def test_a_run_that_meets_every_target_misses_none() -> None:
    row = zoo_report.architecture_row("gpt2", _document(
        {"hvd": 100.0, "torch-ddp": 98.0, "commsched:horovod": 99.0, "commsched:dear": 85.0,
         "commsched:auto": 86.0}))
    assert (row.best, row.best_vs_hvd, row.slowest) == ("commsched:dear", 0.85,
                                                        "commsched:horovod")
    assert row.best_vs_floor == pytest.approx(85.0 / 60.0)
    assert row.auto_vs_fastest == pytest.approx(86.0 / 85.0)
    assert row.noise == pytest.approx(0.04)
    # 85 ms against a 60 ms floor is 1.42x: that target alone is missed.
    assert row.misses() == ["best 1.417x the floor > 1.1"]


def test_each_missed_target_is_named() -> None:
    row = zoo_report.architecture_row("llama", _document(
        {"hvd": 100.0, "commsched:mgwfbp": 95.0, "commsched:dear": 112.0,
         "commsched:auto": 99.0}, floor=None))
    assert row.best_vs_floor is None
    assert row.misses() == ["best 0.950x hvd > 0.9", "commsched:dear 1.120x hvd > 1.05",
                            "auto 1.042x the fastest > 1.03"]


def test_a_run_without_hvd_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="t5: the run holds no hvd"):
        zoo_report.architecture_row("t5", _document({"commsched:dear": 1.0}))


def test_the_report_has_a_row_and_a_section_per_run(tmp_path: pathlib.Path) -> None:
    for name, dear in (("gpt2", 80.0), ("vit", 90.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(_document(
            {"hvd": 100.0, "commsched:dear": dear, "commsched:auto": dear})))
        (tmp_path / name / "results.md").write_text(f"# {name} on 2 ranks\n\n| table |\n")
    assert zoo_report.main([str(tmp_path), "--command", "scripts/bench_zoo.sh"]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "## gpt2 on 2 ranks" in text and "## vit on 2 ranks" in text
    assert text.count("| gpt2 (") == 1 and text.count("| vit (") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["name"] for r in summary["rows"]] == ["gpt2", "vit"]
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_the_zoo_job_runs_each_architecture_at_its_own_rate() -> None:
    knobs = bench_jobs.ZOO.knobs_from({"MODELS": "gpt2 mixtral", "RATE_MIXTRAL": "3gbit"})
    lines = driver.dry_run(bench_jobs.ZOO, knobs)
    assert [line for line in lines if line.startswith("scripts/netem.sh up")] == [
        "scripts/netem.sh up 1.2gbit", "scripts/netem.sh up 3gbit"]
    assert len(bench_jobs.ZOO_MODELS) >= 8
    with pytest.raises(bench_jobs.JobError, match="no zoo architecture 'bert'"):
        bench_jobs.ZOO.launches({**knobs, "MODELS": "bert"})
