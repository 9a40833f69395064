"""COMMSCHED_PROFILE: the profile JSON after the profiling steps, and identical plans."""

from __future__ import annotations

import json

from helpers import distributed_test


def _profile_job(path: str) -> dict:
    import torch
    from torch import nn

    import commsched

    rank = commsched.init().rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="prophet", profile_steps=3, profile=path,
                                         partition_bytes=512)
    for step in range(5):
        opt.zero_grad()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
        model(x).square().mean().backward()
        opt.step()
    opt.flush()
    return {"fingerprint": opt.plan.fingerprint, "policy": opt.plan.policy}


def test_profile_json_and_identical_plans(tmp_path) -> None:
    path = tmp_path / "profile.json"
    results = distributed_test(_profile_job, world_size=2, timeout=90, args=(str(path),))
    assert results[0] == results[1] and results[0]["policy"] == "prophet"
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 2 and doc["world_size"] == 2 and doc["iterations"] == 3
    assert doc["compute"]["before_first_ready_s"] > 0 and doc["compute"]["step_s"] > 0
    assert {t["name"]: t["module"] for t in doc["tensors"]}["2.bias"] == "2"
    names = [t["name"] for t in doc["tensors"]]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    ready = {t["name"]: t["ready_time_s"] for t in doc["tensors"]}
    assert all(v is not None and v >= 0 for v in ready.values())
    assert ready["4.weight"] <= ready["0.weight"]  # backward produces the last layer first
    modules = [m["name"] for m in sorted(doc["modules"], key=lambda m: m["forward_order"])]
    assert modules[:2] == ["", "0"] and modules.index("2") < modules.index("4")
    assert all(m["forward_time_s"] > 0 for m in doc["modules"])
    root = next(m for m in doc["modules"] if m["name"] == "")
    assert 0 <= root["self_time_s"] < root["forward_time_s"]  # the layers ran inside it
    allreduce = doc["collectives"]["allreduce"]
    assert allreduce["alpha_s"] >= 0 and allreduce["beta_s_per_byte"] >= 0
    assert len(allreduce["samples"]) >= 6 * 3  # one collective per tensor while profiling
