"""The compression convergence harness's `--resume`: an earlier report's runs are reused only
under the same settings, and only after one of them, trained again, comes out the same."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks.harness import compression_convergence

SHORT = ["--steps", "3", "--seeds", "0", "--profile-steps", "1", "--only", "none", "topk-10%"]


def _run(out: pathlib.Path, *extra: str) -> dict:
    assert compression_convergence.main(["--out", str(out), *SHORT, *extra]) == 0
    return json.loads((out / "results.json").read_text())


def test_resume_reuses_the_runs_of_an_earlier_report(tmp_path: pathlib.Path) -> None:
    first = _run(tmp_path / "first", "--lrs", "0.1")
    second = _run(tmp_path / "second", "--lrs", "0.1", "0.05", "--resume",
                  str(tmp_path / "first" / "results.json"))
    assert second["resumed"]["reused"] == 2
    assert len(second["grid"]) == 4
    reused = [r for r in second["grid"] if r["lr"] == 0.1]
    assert reused == first["grid"]  # taken as they were, timings included
    assert "came out the same" in (tmp_path / "second" / "README.md").read_text()


def test_resume_refuses_a_report_of_other_settings(tmp_path: pathlib.Path) -> None:
    _run(tmp_path / "first", "--lrs", "0.1")
    with pytest.raises(SystemExit, match="its steps was 3, this run's is 4"):
        compression_convergence.main(["--out", str(tmp_path / "second"), *SHORT, "--steps", "4",
                                      "--resume", str(tmp_path / "first" / "results.json")])


def test_resume_refuses_runs_that_train_differently_now(tmp_path: pathlib.Path) -> None:
    first = _run(tmp_path / "first", "--lrs", "0.1")
    for run in first["grid"]:
        run["test_acc"] -= 1.0  # as if the code had changed since
    (tmp_path / "first" / "results.json").write_text(json.dumps(first))
    with pytest.raises(SystemExit, match="trained again gave loss"):
        _run(tmp_path / "second", "--lrs", "0.1", "--resume",
             str(tmp_path / "first" / "results.json"))
