"""Parity with hvd.DistributedOptimizer, launched through horovodrun on 2 and 3 ranks.

One launch per world size runs every configuration (see parity_job.py); each configuration is
then its own test case here.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from launch import JOBS, job_results, rank_outcomes
from parity_job import PARITY_KEYS

pytestmark = pytest.mark.launcher



def parity_results(np: int, tmp_dir: str) -> dict[str, Any]:
    return job_results(np, os.path.join(JOBS, "parity_job.py"), tmp_dir, timeout=400)


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("key", PARITY_KEYS)
def test_parity_with_horovod(np: int, key: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    results = parity_results(np, str(tmp_path_factory.getbasetemp()))
    for rank, outcome in enumerate(rank_outcomes(results, key, np)):
        assert outcome["moved"] > 1e-3, "training did not move the parameters"
        assert outcome["ok"], f"rank {rank}: {key} differs from Horovod: {outcome['diffs']}"


@pytest.mark.parametrize("np", [2, 3])
def test_negative_control_is_detected(np: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Summing where Horovod averages must fail the comparison: the check can fail."""
    results = parity_results(np, str(tmp_path_factory.getbasetemp()))
    for outcome in rank_outcomes(results, "control-sum-vs-average", np):
        assert not outcome["ok"] and outcome["max_diff"] > 1e-4
