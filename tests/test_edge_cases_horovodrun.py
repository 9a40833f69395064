"""Gradient edge cases against synchronous Horovod for every policy (see edge_cases_job.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from edge_cases_job import POLICIES
from launch import JOBS, job_results, rank_outcomes

pytestmark = pytest.mark.launcher



def edge_results(tmp_dir: str) -> dict[str, Any]:
    return job_results(2, os.path.join(JOBS, "edge_cases_job.py"), tmp_dir, timeout=300)


@pytest.mark.parametrize("policy", POLICIES)
def test_gradient_edge_cases_match_horovod(policy: str,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    results = edge_results(str(tmp_path_factory.getbasetemp()))
    for rank, outcome in enumerate(rank_outcomes(results, policy, 2)):
        assert outcome["ok"], f"rank {rank}: {policy} differs from Horovod: {outcome['diffs']}"
