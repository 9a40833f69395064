"""The ``commsched`` entry of a wrapped optimizer's state_dict(), in a world of one: it carries the
plan and the position, it loads into a plain torch optimizer, a plain state_dict loads into a
wrapped one, and an entry made for another wrap is refused naming the difference."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer as Wrapped


def _model(width: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))


def _wrap(model: nn.Module, policy: str = "mgwfbp", **kw: Any) -> Wrapped:
    return commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), model=model, policy=policy, profile_steps=2,
        **kw)


def _steps(model: nn.Module, opt: torch.optim.Optimizer, count: int) -> None:
    for _ in range(count):
        opt.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        opt.step()


@pytest.mark.parametrize("policy", ["mgwfbp", "prophet"])
def test_resume_restores_plan_and_skips_profiling(policy: str) -> None:
    model = _model()
    opt = _wrap(model, policy)
    _steps(model, opt, 3)
    state = opt.state_dict()
    entry = state["commsched"]
    assert entry["plan"]["fingerprint"] == opt.plan.fingerprint and entry["iteration"] == 3
    assert entry["plan"]["policy"] == policy  # profiling (plan "layerwise") is over
    fresh_model = _model()
    fresh = _wrap(fresh_model, policy)
    assert fresh.plan.policy == "layerwise"
    fresh.load_state_dict(state)
    assert fresh.plan.fingerprint == opt.plan.fingerprint
    assert fresh.session.state.iteration == 3
    if policy == "prophet":
        runner, original = fresh.session.modes.runner, opt.session.modes.runner
        assert runner is not None and original is not None  # prophet overlaps iterations
        assert runner.active and runner.modules.order == original.modules.order
    _steps(fresh_model, fresh, 2)
    assert fresh.plan.fingerprint == opt.plan.fingerprint  # no profiling, no re-plan


def test_entry_saved_while_profiling_keeps_the_remaining_profiling_steps() -> None:
    model = _model()
    opt = _wrap(model)
    _steps(model, opt, 1)
    fresh = _wrap(_model())
    fresh.load_state_dict(opt.state_dict())
    assert fresh.session.state.iteration == 1 and fresh.session.lifecycle.replan_at == 2
    assert fresh.plan.policy == "layerwise"


def test_wrapped_state_loads_into_plain_torch_and_back() -> None:
    model = _model()
    opt = _wrap(model)
    _steps(model, opt, 3)
    plain = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    plain.load_state_dict(opt.state_dict())  # torch ignores the extra entry
    first = model[0]
    assert isinstance(first, nn.Linear)
    assert torch.equal(plain.state[first.weight]["momentum_buffer"],
                       opt.state[first.weight]["momentum_buffer"])
    other = _wrap(_model())
    before = other.plan.fingerprint
    other.load_state_dict(plain.state_dict())  # no entry: the run profiles and plans as today
    assert other.plan.fingerprint == before and other.session.state.iteration == 0


def test_entry_for_another_policy_or_other_tensors_is_refused() -> None:
    model = _model()
    opt = _wrap(model, "mgwfbp")
    _steps(model, opt, 3)
    state = opt.state_dict()
    with pytest.raises(ValueError, match="saved with policy 'mgwfbp' and this optimizer runs "
                                         "policy 'horovod'"):
        _wrap(_model(), "horovod").load_state_dict(state)
    with pytest.raises(ValueError, match=r"tensor 0 is \['0.weight', 12, 'float32'\] in the "
                                         r"checkpoint and \['0.weight', 15, 'float32'\] here"):
        _wrap(_model(width=5), "mgwfbp").load_state_dict(state)
    damaged = dict(state, commsched=dict(state["commsched"], plan=dict(
        state["commsched"]["plan"], fingerprint="0" * 16)))
    with pytest.raises(ValueError, match="damaged"):
        _wrap(_model(), "mgwfbp").load_state_dict(damaged)
