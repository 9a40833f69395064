"""The step mode follows the plan (runtime/modes/, Note [A step mode is an object]): the
profiling steps run the synchronous mode, an overlap policy's plan the overlap mode, a settled
world of one the plain one, and `auto` in a world of one a synchronous plan; loading a
checkpoint puts the planned mode back."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched.runtime.modes import ModeKind


def _wrapped(policy: str, **knobs: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
        model=model, policy=policy, **knobs)
    return model, opt


def _kinds(model: nn.Module, opt: Any, steps: int) -> list[ModeKind]:
    """The mode each step() ran under (read before the step, as step() dispatches on it)."""
    kinds = []
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 3, generator=torch.Generator().manual_seed(step))).sum().backward()
        kinds.append(opt.session.mode.kind)
        opt.step()
    return kinds


def _runs(kinds: list[ModeKind]) -> list[ModeKind]:
    """The modes in the order they ran, each once per stretch."""
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] is not k]


@pytest.mark.parametrize(("policy", "planned"), [("horovod", ModeKind.SYNCHRONOUS),
                                                 ("dear", ModeKind.OVERLAP)])
def test_the_mode_follows_the_plan_to_the_plain_optimizer(policy: str,
                                                          planned: ModeKind) -> None:
    commsched.init()
    model, opt = _wrapped(policy)
    kinds = _kinds(model, opt, 120)
    expected = [ModeKind.SYNCHRONOUS, planned, ModeKind.PLAIN]
    assert _runs(kinds) == (expected if planned is not ModeKind.SYNCHRONOUS
                            else [ModeKind.SYNCHRONOUS, ModeKind.PLAIN]), kinds
    assert kinds[0] is ModeKind.SYNCHRONOUS  # the profiling steps
    assert opt.session.modes.planned.kind is planned  # the plan stays the policy's
    opt.load_state_dict(opt.state_dict())  # hooks the gradients again: the planned mode runs
    assert opt.session.mode.kind is planned


def test_an_overlap_plan_kept_through_the_engine_stays_in_the_overlap_mode() -> None:
    commsched.init()
    model, opt = _wrapped("bytescheduler")
    opt.session.never_pass_through()
    kinds = _kinds(model, opt, 40)
    assert _runs(kinds) == [ModeKind.SYNCHRONOUS, ModeKind.OVERLAP], kinds
    assert opt.session.mode.defers_updates


def test_auto_in_a_world_of_one_runs_a_synchronous_plan() -> None:
    commsched.init()
    model, opt = _wrapped("auto")
    opt.session.never_pass_through()
    kinds = _kinds(model, opt, 30)
    assert set(kinds) == {ModeKind.SYNCHRONOUS}, kinds
    assert opt.plan.policy in {"horovod", "ddp", "mgwfbp"}
