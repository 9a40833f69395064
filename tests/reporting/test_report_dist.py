"""`python -m commsched report` on a real 2-rank run: one synchronous policy (horovod) and one
that overlaps iterations (bytescheduler), both in one spawned job."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from helpers import distributed_test

from commsched.reporting import command

pytestmark = pytest.mark.processes

STEPS = 8
POLICIES: dict[str, dict[str, Any]] = {"horovod": {},
                                       "bytescheduler": {"partition_bytes": 32 * 1024}}


def _train(run_root: str) -> dict:
    import time

    import torch
    from torch import nn

    import commsched

    commsched.init()
    out, keep = {}, []
    for policy, knobs in POLICIES.items():
        run_dir = os.path.join(run_root, policy)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10))
        opt = commsched.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
            model=model, policy=policy, profile_steps=3, timeline=f"{run_dir}/timeline.json",
            profile=f"{run_dir}/profile.json", **knobs)
        step_ends = []
        for _ in range(STEPS):
            opt.zero_grad()
            model(torch.randn(32, 64)).square().mean().backward()
            opt.step()
            step_ends.append(time.perf_counter())
        opt.flush()  # an overlapped last iteration's collectives reach the timeline here
        keep.append(opt)  # the timeline is closed by commsched.shutdown()
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        out[policy] = {"step_ends": step_ends, "blocks": len(opt.plan.blocks),
                       "gradient_bytes": gradient_bytes}
    return out


def test_report_of_a_real_run(tmp_path) -> None:
    for policy in POLICIES:
        (tmp_path / policy).mkdir()
    results = distributed_test(_train, world_size=2, timeout=90, args=(str(tmp_path),))
    for policy in POLICIES:
        run_dir = tmp_path / policy
        out = run_dir / "report.json"
        assert command.main([str(run_dir), "--link", "1gbit", "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["world_size"] == 2 and len(doc["ranks"]) == 2
        assert (run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"
        for r in doc["ranks"]:
            job = results[r["rank"]][policy]
            # Default skip: the 3 profiling steps and the step that re-planned.
            assert r["skip"] == 4 and r["iterations"] == STEPS - 4, (policy, r)
            ends = job["step_ends"]
            wall = ends[-1] - ends[r["skip"] - 1]
            assert r["elapsed_s"] == pytest.approx(wall, rel=0.25, abs=0.005), (policy, r, wall)
            mean = wall / r["iterations"]
            assert r["iteration_time_s"] > 0
            assert mean / 5 <= r["iteration_time_s"] <= 2 * mean + 0.002
            assert 0 <= r["overlap"] <= 1, (policy, r)
            assert 0 <= r["network_idle"] < 1 and 0 <= r["compute_idle"] < 1, (policy, r)
            assert r["compute_busy_s"] == pytest.approx(r["elapsed_s"] - r["wait_s"])
            # Ring all-reduce on 2 ranks: 2(p-1)/p = 1, every gradient byte once per iteration.
            assert r["collectives_per_iteration"] == job["blocks"], (policy, r)
            assert r["wire_bytes_per_iteration"] == job["gradient_bytes"] == doc["gradient_bytes"]
            assert r["achieved_bytes_per_s"] > 0 and r["link_utilisation"] > 0
