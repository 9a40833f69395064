"""Output paths: folders are made, and a path that cannot be written is one line at start."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import commsched
from benchmarks.harness import overhead
from commsched.__main__ import main as commsched_main
from commsched.bench import compare
from commsched.outputs import OutputPathError, prepare_dir, prepare_file


@pytest.fixture
def blocker(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file: nothing can be created below it."""
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


def test_prepare_makes_folders_and_leaves_no_file(tmp_path: pathlib.Path) -> None:
    assert prepare_dir(str(tmp_path / "x" / "y"), "--out") == str(tmp_path / "x" / "y")
    assert (tmp_path / "x" / "y").is_dir() and not list((tmp_path / "x" / "y").iterdir())
    target = tmp_path / "p" / "q" / "r.json"
    prepare_file(str(target), "--json")
    assert target.parent.is_dir() and not target.exists()
    target.write_text("kept")
    prepare_file(str(target), "--json")
    assert target.read_text() == "kept"


def test_unwritable_paths_are_one_line(blocker: pathlib.Path) -> None:
    with pytest.raises(OutputPathError, match=r"^--out .*a-file/sub: cannot write there"):
        prepare_dir(str(blocker / "sub"), "--out")
    with pytest.raises(OutputPathError, match="is a directory"):
        prepare_file(str(blocker.parent), "--json")


@pytest.mark.parametrize("main", [compare.main, overhead.main])
def test_benchmarks_refuse_a_bad_out_before_training(
        main: Callable[[list[str]], int], blocker: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(blocker / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "cannot write" in err[0], err


def test_compare_refuses_a_bad_predict_dir(blocker: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.harness import compare_predict

    assert compare_predict.main(["--predict-dir", str(blocker / "p")]) == 2
    assert "--predict-dir" in capsys.readouterr().err


def test_shipped_compare_names_where_its_predictions_live(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Note [What ships measures; the repository predicts]: refused before any training.
    for flags in (["--predict"], ["--predict-dir", "somewhere"]):
        assert compare.main(flags) == 2
        assert "python -m benchmarks.harness.compare_predict" in capsys.readouterr().err


def test_simulate_refuses_bad_outputs_and_makes_folders(
        blocker: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--profile", "resnet50", "--workers", "8", "--bandwidth", "10gbit",
            "--policy", "horovod", "--knobs", "default"]
    assert commsched_main([*args, "--json", str(blocker / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0], err
    out = tmp_path / "made" / "rows.json"
    assert commsched_main([*args, "--json", str(out)]) == 0
    assert out.read_text().startswith("{")


@pytest.mark.parametrize("knob,variable", [("timeline", "COMMSCHED_TIMELINE"),
                                           ("profile", "COMMSCHED_PROFILE")])
def test_file_knobs_fail_at_wrap_time(knob: str, variable: str, blocker: pathlib.Path) -> None:
    model = nn.Linear(2, 2)
    knobs: dict[str, Any] = {knob: str(blocker / "x.json")}
    with pytest.raises(OutputPathError, match=variable):
        commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), **knobs)
