"""Parity with hvd.DistributedOptimizer, launched through horovodrun on 2 and 3 ranks.

One launch per world size runs every configuration (see parity_job.py); each configuration is
then its own test case here.
"""

from __future__ import annotations

import json
import os

import pytest
from launch import horovodrun
from parity_job import PARITY_KEYS

HERE = os.path.dirname(os.path.abspath(__file__))
_cache: dict[int, dict] = {}


def parity_results(np: int, tmp_dir: str) -> dict:
    if np not in _cache:
        out = os.path.join(tmp_dir, f"parity{np}.json")
        horovodrun(np, os.path.join(HERE, "parity_job.py"), out, timeout=400)
        with open(out, encoding="utf-8") as handle:
            _cache[np] = json.load(handle)
    return _cache[np]


@pytest.mark.e2e
@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("key", PARITY_KEYS)
def test_parity_with_horovod(np: int, key: str, tmp_path_factory) -> None:
    results = parity_results(np, str(tmp_path_factory.getbasetemp()))
    assert results["size"] == np
    for rank, outcome in enumerate(results["results"][key]["ranks"]):
        assert "error" not in outcome, f"rank {rank}: {outcome.get('error')}"
        assert outcome["moved"] > 1e-3, "training did not move the parameters"
        assert outcome["ok"], f"rank {rank}: {key} differs from Horovod: {outcome['diffs']}"


@pytest.mark.e2e
@pytest.mark.parametrize("np", [2, 3])
def test_negative_control_is_detected(np: int, tmp_path_factory) -> None:
    """Summing where Horovod averages must fail the comparison: the check can fail."""
    results = parity_results(np, str(tmp_path_factory.getbasetemp()))
    for outcome in results["results"]["control-sum-vs-average"]["ranks"]:
        assert "error" not in outcome
        assert not outcome["ok"] and outcome["max_diff"] > 1e-4
