"""broadcast_parameters / broadcast_optimizer_state / broadcast_object across Gloo ranks."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test

pytestmark = pytest.mark.processes


def _broadcast_job() -> dict:
    import commsched

    commsched.init()
    rank = commsched.rank()
    torch.manual_seed(100 + rank)  # every rank starts different
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # rank-specific Adam state
    commsched.broadcast_parameters(model.state_dict(), root_rank=1)
    commsched.broadcast_optimizer_state(opt, root_rank=1)
    state = opt.state[model.weight]
    return {"weight": model.weight.detach().clone(), "exp_avg": state["exp_avg"].clone(),
            "lr": opt.param_groups[0]["lr"],
            "object": commsched.broadcast_object({"from": rank}, root_rank=1)}


def test_broadcasts_copy_root_state_everywhere() -> None:
    results = distributed_test(_broadcast_job, world_size=3, timeout=90)
    root = results[1]
    for out in results.values():
        assert torch.equal(out["weight"], root["weight"])
        assert torch.equal(out["exp_avg"], root["exp_avg"])
        assert out["lr"] == 0.02 and out["object"] == {"from": 1}
    assert not torch.equal(results[0]["weight"], torch.zeros_like(root["weight"]))
