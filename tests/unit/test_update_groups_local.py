"""Update groups in a running overlap plan (world of one): planned from the profile, hooks only
where a group starts, and the same parameters as the plain optimizer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import commsched


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    if hasattr(opt, "flush"):
        opt.flush()


def _hooked(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if m._forward_pre_hooks}


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet", "dear"])
@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
])
def test_planned_groups_update_like_the_plain_optimizer(
        policy: str, make: Callable[..., torch.optim.Optimizer]) -> None:
    model, twin = _model(), _model()
    ours = commsched.DistributedOptimizer(make(model.parameters()), model=model, policy=policy,
                                          named_parameters=model.named_parameters(),
                                          profile_steps=2)
    assert len(_hooked(model)) == len(list(model.modules()))  # profiling: every module records
    _train(model, ours, 6)
    _train(twin, make(twin.parameters()), 6)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    session = ours.session
    groups = ours.plan.update_groups
    assert session.defers_updates and groups, "an overlap plan with planned update groups"
    assert sorted(t for g in groups for t in g.tensor_ids) == list(range(8))
    # Hooks now only where a group starts (the root's end-of-forward hook is a forward hook).
    assert _hooked(model) == {g.module for g in groups}
    # The split update of the profiling steps timed calls of two sizes: a fitted call cost.
    compute = session.profile_document()["compute"]
    assert compute["update_fixed_s"] >= 0 and compute["update_per_byte_s"] >= 0
    assert len({n for n, _ in session.engine.profiler.update_samples}) >= 2
    session.close()


def test_a_costly_call_with_nothing_to_wait_for_makes_one_group() -> None:
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model=model, policy="bytescheduler",
                                         named_parameters=model.named_parameters(),
                                         profile_steps=2)
    _train(model, opt, 3)
    # A world of one: every block is done before the forward pass starts, so nothing is
    # gained by a second call.
    assert len(opt.plan.update_groups) == 1
    group = opt.plan.update_groups[0]
    assert group.module == "0" and group.tensor_ids == tuple(range(8))
    assert _hooked(model) == {"0"}
    opt.session.close()
