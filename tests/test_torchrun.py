"""End to end through torchrun (env:// bootstrap, no Horovod)."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from launch import BIN, JOBS, run_job, torchrun

pytestmark = pytest.mark.launcher



def test_torchrun_training_matches_reference() -> None:
    result = torchrun(2, os.path.join(JOBS, "torchrun_job.py"), timeout=240)
    # Both ranks share one stdout, so their lines may run together: match, don't split lines.
    verdicts = re.findall(r"rank (\d) policy (\w+): max diff \S+ (OK|FAIL)", result.stdout)
    assert sorted(verdicts) == sorted((str(r), p, "OK") for r in range(2)
                                      for p in ("horovod", "ddp", "mgwfbp")), result.stdout[-3000:]


def _torchrun_restart_job(out_dir: str, fail_at: int) -> str:
    os.makedirs(out_dir)
    result = run_job([os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node=3",
                      "--max-restarts=1", os.path.join(JOBS, "torchrun_restart_job.py"), out_dir,
                      str(fail_at)], timeout=240)
    return result.stdout


def test_torchrun_restart_resumes_from_checkpoint_bit_identically(tmp_path) -> None:
    """Rank 1 exits with status 3 at step 7 of the first attempt; torchrun restarts the group,
    which resumes from the step-6 checkpoint. Three ranks: fusion boundaries change float sums,
    so the restarted job must run the saved plan (no new profiling) to end bit-identical."""
    whole_dir, restarted_dir = str(tmp_path / "whole"), str(tmp_path / "restarted")
    _torchrun_restart_job(whole_dir, fail_at=-1)
    output = _torchrun_restart_job(restarted_dir, fail_at=7)
    with open(os.path.join(restarted_dir, "events.jsonl"), encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle]
    assert [e["attempt"] for e in events] == [0, 1], (events, output[-3000:])
    assert events[1]["resumed_at"] == 6, events
    for rank in range(3):
        whole = torch.load(os.path.join(whole_dir, f"final.rank{rank}.pt"))
        resumed = torch.load(os.path.join(restarted_dir, f"final.rank{rank}.pt"))
        assert resumed["start"] == 6
        # The steps after the restart ran the plans the uninterrupted job ran then.
        assert resumed["plans"] == whole["plans"][6:], (resumed["plans"], whole["plans"])
        assert events[1]["plan"] == whole["plans"][6]
        for p, q in zip(resumed["params"], whole["params"], strict=True):
            assert torch.equal(p, q), f"rank {rank}: max diff {float((p - q).abs().max()):.3g}"
