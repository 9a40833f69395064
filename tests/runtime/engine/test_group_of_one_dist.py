"""The test-only way to run the process-group transport in a world of one
(EngineHandle.process_group_at_size_one; tests/test_policies_cuda.py uses it with an NCCL group
of one): here with a Gloo group of one on CPU tensors, the threaded engine and a real c10d
collective per block give the plain optimizer's result, and every figure says it came from the
CPU clock."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test, step_alike
from torch import nn

pytestmark = pytest.mark.processes


def _job() -> dict:
    import commsched
    from commsched.runtime.engine.handle import EngineHandle

    EngineHandle.process_group_at_size_one = True
    commsched.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin.load_state_dict(model.state_dict())
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         policy="mgwfbp", profile_steps=2)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        step_alike(((model, opt), (twin, plain)), x)
    engine = opt.session.engine
    out = {"group": engine._group is not None, "world": engine._engine.world_size,
           "clocks": engine._engine.last_clocks(), "doc": opt.session.profile_document(),
           "equal": all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(),
                                                          strict=True))}
    opt.session.close()
    return out


def test_a_gloo_group_of_one_runs_the_process_group_transport() -> None:
    result = distributed_test(_job, world_size=1, timeout=120)[0]
    assert result["group"] and result["world"] == 1 and result["equal"]
    assert result["clocks"] == {"ready": "cpu", "collective": "cpu"}
    doc = result["doc"]
    assert doc["collectives"]["allreduce"]["clock"] == "cpu" and \
        doc["collectives"]["allreduce"]["samples"]
    assert set(doc["clocks"].values()) == {"cpu"} and "collective_s" in doc["clocks"]
