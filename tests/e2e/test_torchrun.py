"""End to end through torchrun (env:// bootstrap, no Horovod)."""

from __future__ import annotations

import os
import re

import pytest
from launch import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.e2e
def test_torchrun_training_matches_reference() -> None:
    result = torchrun(2, os.path.join(HERE, "torchrun_job.py"), timeout=240)
    # Both ranks share one stdout, so their lines may run together: match, don't split lines.
    verdicts = re.findall(r"rank (\d) policy (\w+): max diff \S+ (OK|FAIL)", result.stdout)
    assert sorted(verdicts) == sorted((str(r), p, "OK") for r in range(2)
                                      for p in ("horovod", "ddp", "mgwfbp")), result.stdout[-3000:]
