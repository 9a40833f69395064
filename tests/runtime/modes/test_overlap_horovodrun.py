"""Cross-iteration overlap policies against synchronous hvd.DistributedOptimizer, through
horovodrun on 2 and 3 ranks (one launch per world size; see overlap_parity_job.py)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from launch import JOBS, job_results, rank_outcomes
from overlap_parity_job import OVERLAP_KEYS

pytestmark = pytest.mark.launcher



def overlap_results(np: int, tmp_dir: str) -> dict[str, Any]:
    # A short COMMSCHED_TIMEOUT turns a broken configuration into a quick, named failure.
    return job_results(np, os.path.join(JOBS, "overlap_parity_job.py"), tmp_dir, timeout=500,
                       env={"COMMSCHED_TIMEOUT": "60"}, explain=lambda out: _progress(out, np))


def _progress(out: str, np: int) -> str:
    lines = ["per-rank progress:"]
    for rank in range(np):
        try:
            with open(f"{out}.rank{rank}", encoding="utf-8") as handle:
                done = json.load(handle)
        except OSError:
            lines.append(f"rank {rank}: no progress file")
            continue
        bad = {k: v.get("error", "not allclose")[-800:] for k, v in done.items() if not v["ok"]}
        lines.append(f"rank {rank}: {len(done)} configurations done, failing: {bad}")
    return "\n".join(lines)


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("key", OVERLAP_KEYS)
def test_overlap_matches_synchronous_horovod(np: int, key: str,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    results = overlap_results(np, str(tmp_path_factory.getbasetemp()))
    for rank, outcome in enumerate(rank_outcomes(results, key, np)):
        assert outcome["overlapped"], "the overlap runner never became active"
        assert outcome["state_ok"], "state_dict() does not cover every parameter"
        assert outcome["ok"], (f"rank {rank}: {key} differs from synchronous Horovod: params "
                               f"{outcome['diffs']}, evaluation {outcome['eval_diff']}")
