"""Gradient edge cases against synchronous Horovod for every policy (see edge_cases_job.py)."""

from __future__ import annotations

import json
import os

import pytest
from edge_cases_job import POLICIES
from launch import horovodrun

HERE = os.path.dirname(os.path.abspath(__file__))
_cache: dict[str, dict] = {}


def edge_results(tmp_dir: str) -> dict:
    if "results" not in _cache:
        out = os.path.join(tmp_dir, "edge.json")
        horovodrun(2, os.path.join(HERE, "edge_cases_job.py"), out, timeout=300)
        with open(out, encoding="utf-8") as handle:
            _cache["results"] = json.load(handle)["results"]
    return _cache["results"]


@pytest.mark.e2e
@pytest.mark.parametrize("policy", POLICIES)
def test_gradient_edge_cases_match_horovod(policy: str, tmp_path_factory) -> None:
    results = edge_results(str(tmp_path_factory.getbasetemp()))
    for rank, outcome in enumerate(results[policy]["ranks"]):
        assert "error" not in outcome, f"rank {rank}: {outcome.get('error')}"
        assert outcome["ok"], f"rank {rank}: {policy} differs from Horovod: {outcome['diffs']}"
