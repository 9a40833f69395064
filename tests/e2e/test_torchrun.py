"""End to end through torchrun (env:// bootstrap, no Horovod)."""

from __future__ import annotations

import os

import pytest
from launch import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.e2e
def test_torchrun_training_matches_reference() -> None:
    result = torchrun(2, os.path.join(HERE, "torchrun_job.py"), timeout=240)
    lines = [line for line in result.stdout.splitlines() if "policy" in line]
    assert len([line for line in lines if line.endswith("OK")]) == 6, result.stdout[-3000:]
