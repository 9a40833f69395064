"""examples/ as a user runs them: each example for a few steps on 2 ranks at reduced shapes,
under torchrun and horovodrun, with --amp and a checkpoint that a second launch resumes from."""

from __future__ import annotations

import json
import math
import os

import pytest
from launch import REPO, horovodrun, torchrun

pytestmark = pytest.mark.launcher

EXAMPLES = os.path.join(REPO, "examples")
TINY_TRANSFORMER = ("--seq-len", "16", "--layers", "2", "--hidden", "64", "--heads", "2",
                    "--vocab", "1000")
COMMON = ("--batch-size", "2", "--threads", "1", "--log-every", "1")


def _summaries(path: str) -> list[dict]:
    out = []
    for rank in range(2):
        with open(path.replace("{rank}", str(rank)), encoding="utf-8") as handle:
            out.append(json.load(handle))
    return out


def _check(summaries: list[dict], start: int, steps: int, policy: str) -> None:
    for summary in summaries:
        assert summary["start"] == start and summary["policy"] == policy, summary
        assert [int(k) for k in summary["losses"]] == list(range(start, steps)), summary
        assert all(math.isfinite(v) for v in summary["losses"].values()), summary
    # Every rank ends with the same parameters; their data differ, so their losses do.
    assert summaries[0]["digest"] == summaries[1]["digest"], summaries
    assert summaries[0]["losses"] != summaries[1]["losses"], summaries


def test_resnet50_checkpoints_under_torchrun_and_resumes_under_horovodrun(tmp_path) -> None:
    """fp16 autocast with a GradScaler under an overlap policy; the checkpoint holds the plan,
    so the resumed job needs no profiling."""
    checkpoint, summary = str(tmp_path / "resnet50.pt"), str(tmp_path / "first{rank}.json")
    args = (*COMMON, "--image-size", "32", "--classes", "10", "--amp", "--policy",
            "bytescheduler", "--checkpoint", checkpoint, "--checkpoint-every", "3")
    first = torchrun(2, os.path.join(EXAMPLES, "pytorch_resnet50.py"), *args, "--steps", "3",
                     "--summary", summary, timeout=240)
    assert "starting at step 0" in first.stdout, first.stdout[-3000:]
    _check(_summaries(summary), 0, 3, "bytescheduler")
    summary = str(tmp_path / "resumed{rank}.json")
    resumed = horovodrun(2, os.path.join(EXAMPLES, "pytorch_resnet50.py"), *args, "--steps", "5",
                         "--summary", summary, timeout=240)
    assert "resumed at step 3" in resumed.stdout, resumed.stdout[-3000:]
    _check(_summaries(summary), 3, 5, "bytescheduler")


@pytest.mark.parametrize(("script", "launcher", "extra"), [
    # --knob compression=fp16, as the examples' help suggests: the knob's value as a string.
    # Two profiling steps, so that dear's plan runs, over recomputed activations.
    ("pytorch_bert.py", "torchrun", ("--amp", "bf16", "--knob", "compression=fp16", "--knob",
                                     "profile_steps=2", "--gradient-checkpointing", "--policy",
                                     "dear")),
    ("pytorch_gpt2.py", "horovodrun", ("--amp", "--policy", "auto")),
])
def test_transformer_example_trains_on_two_ranks(tmp_path, script: str, launcher: str,
                                                 extra: tuple[str, ...]) -> None:
    pytest.importorskip("transformers", reason="setup.sh installs the examples extra")
    summary = str(tmp_path / "summary{rank}.json")
    launch = torchrun if launcher == "torchrun" else horovodrun
    launch(2, os.path.join(EXAMPLES, script), *COMMON, *TINY_TRANSFORMER, *extra, "--steps", "4",
           "--summary", summary, timeout=240)
    _check(_summaries(summary), 0, 4, extra[-1])
