"""commsched.lightning end to end: Lightning Trainers on 2 ranks under torchrun, commsched's
strategy against Lightning's own DDP strategy (issue 55, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launch import JOBS, REPO, torchrun

pytestmark = pytest.mark.launcher

pytest.importorskip("lightning", reason="the lightning extra is not installed")

RUNS = ("horovod", "dear", "dear/net", "bytescheduler/net")  # lightning_job.RUNS


def test_lightning_strategy_matches_ddp_strategy(tmp_path) -> None:
    """3 epochs of a small MLP regression with accumulate_grad_batches=2 (each epoch ends
    mid-accumulation), a StepLR scheduler, validation and sync_dist logging: every policy's
    final parameters equal DDPStrategy's within 1e-5 and equal on both ranks, and the loss
    falls. Under dear, steps after profiling defer their update to the next forward pass."""
    out = tmp_path / "lightning.json"
    result = torchrun(2, os.path.join(JOBS, "lightning_job.py"), str(out), timeout=300)
    assert out.exists(), result.stdout[-4000:]
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["world"] == 2
    ddp = document["ddp"]
    assert ddp["after"] < 0.8 * ddp["before"], ddp
    for policy in RUNS:
        run = document[policy]
        assert run["max_diff_vs_ddp"] < 1e-5, (policy, run)
        assert run["max_diff_across_ranks"] == 0.0, (policy, run)
        assert run["after"] < 0.8 * run["before"], (policy, run)
    assert document["horovod"]["deferred_steps"] == 0, document["horovod"]
    assert document["dear"]["deferred_steps"] > 0, document["dear"]
    # training_step calling self.net: the overlap stays (the hooks sit on the network's own
    # modules), and the parameters still equal DDP's.
    for run in ("dear/net", "bytescheduler/net"):
        assert document[run]["deferred_steps"] > 0, document[run]


CHECK_OPTIONAL = """
import sys
import commsched
assert "lightning" not in sys.modules, "import commsched imported lightning"
sys.modules["lightning"] = None  # as if the extra were not installed
try:
    import commsched.lightning
except ImportError as err:
    assert "pip install 'lightning>=2.2'" in str(err) and ".[lightning]" in str(err), err
else:
    raise AssertionError("commsched.lightning imported without lightning")
"""


def test_lightning_is_an_optional_extra() -> None:
    """`import commsched` leaves Lightning alone; without it, commsched.lightning says how to
    install it."""
    result = subprocess.run([sys.executable, "-c", CHECK_OPTIONAL], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
