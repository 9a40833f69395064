"""torch.compile with fullgraph=True forbids the graph breaks that an overlap plan's forward
pre-hooks make (Note [Module hooks under torch.compile]): refused at wrap time, avoided by
`auto`."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch import nn

import commsched
from commsched.torch_compat import compiled_fullgraph


def _compile(module: nn.Module, fullgraph: bool = False) -> nn.Module:
    """torch.compile's result, typed as the module it stands for."""
    return cast(nn.Module, torch.compile(module, fullgraph=fullgraph))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_fullgraph_compilation_is_recognised() -> None:
    plain, in_place, in_place_whole = _model(), _model(), _model()
    in_place.compile()
    in_place_whole.compile(fullgraph=True)
    assert not compiled_fullgraph(plain)
    assert not compiled_fullgraph(_compile(plain))
    assert not compiled_fullgraph(in_place)
    assert compiled_fullgraph(_compile(plain, fullgraph=True))
    assert compiled_fullgraph(in_place_whole)


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet", "dear"])
def test_overlap_policies_refuse_a_fullgraph_model(policy: str) -> None:
    model = _compile(_model(), fullgraph=True)
    with pytest.raises(ValueError, match=r"fullgraph=True.*use policy='horovod', 'ddp' or"):
        commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), model=model,
                                       policy=policy)


def test_auto_plans_only_synchronous_policies_for_a_fullgraph_model() -> None:
    model = _compile(_model(), fullgraph=True)
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="auto", profile_steps=1)
    assert opt.session.modes.runner is None  # no overlap plan can be installed
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
    assert opt.plan.policy not in ("bytescheduler", "prophet", "dear")
    opt.session.close()
