"""The overlap runner checks that its hooks ran (Note [No forward pass on a pending update] in
runtime/modes/overlap/guard.py): a forward path that reads parameters without their module's
pre-hooks is found before a plan defers anything, or, where the path changes later, in the
iteration it first does; from then on step() applies every update. World of one, with the
runner kept (never_pass_through), beside the plain optimizer."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import one_group_per_module
from test_update_groups_local import SETTLED, _model
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer as Wrapped
from commsched.runtime.modes.overlap.runner import OverlapRunner


def _wrap(model: nn.Module, policy: str) -> Wrapped:
    opt: Wrapped = commsched.DistributedOptimizer(  # type: ignore[assignment]
        torch.optim.SGD(model.parameters(), lr=0.05), model=model, policy=policy,
        profile_steps=2, named_parameters=model.named_parameters())
    opt.session.never_pass_through()
    return opt


def _x(step: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(step))


class Bypassing(nn.Module):
    """_model()'s layers; with `bypass` its forward reads the last layer's weight without
    calling that layer (F.linear), as code that reaches into a module does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _model()
        self.bypass = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.bypass:
            return self.body(x)
        last = self.body[-1]
        return nn.functional.linear(self.body[:-1](x), last.weight, last.bias)


def _step_both(pairs: list[tuple[Any, torch.optim.Optimizer]],
               forward: Callable[[Any, torch.Tensor], torch.Tensor], step: int
               ) -> list[torch.Tensor]:
    """One step of each (model, optimizer) on the same batch; the forward passes' outputs (what
    they read of the parameters shows there)."""
    outputs = []
    for m, o in pairs:
        o.zero_grad()
        out = forward(m, _x(step))
        out.sum().backward()
        o.step()
        outputs.append(out.detach())
    return outputs


def _called(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x)


def _keeps_deferring(ours: Wrapped, pairs: list[tuple[Any, torch.optim.Optimizer]],
                     split: bool = False) -> OverlapRunner:
    """Trains past the plan's settling (`split`: then one update group per module): every
    forward pass reads what the plain optimizer's does, updates stay deferred, no warning."""
    runner = ours.session.modes.runner
    assert runner is not None
    deferred = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for step in range(SETTLED + 4):
            if split and step == SETTLED:
                one_group_per_module(ours)
            mine, theirs = _step_both(pairs, _called, step)
            assert torch.equal(mine, theirs), step
            deferred += runner.open
    assert deferred >= 4 and not runner.guard.updates_at_step
    return runner


@pytest.mark.parametrize("policy", ["bytescheduler", "dear"])
def test_a_path_that_changes_mid_run_is_caught_in_its_first_iteration(policy: str) -> None:
    model, twin = Bypassing(), Bypassing()
    ours, plain = _wrap(model, policy), torch.optim.SGD(twin.parameters(), lr=0.05)
    runner = ours.session.modes.runner
    assert runner is not None
    switch = SETTLED + 2
    caught: list[str] = []
    deferred = 0
    for step in range(switch + 4):
        if step == SETTLED:  # groups on the modules, not all at the root (a world of one's)
            assert "body.6" in one_group_per_module(ours)
        model.bypass = twin.bypass = step >= switch
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            mine, theirs = _step_both([(model, ours), (twin, plain)], _called, step)
        caught += [str(w.message) for w in seen if "read parameters" in str(w.message)]
        if step < switch:
            deferred += runner.open
            assert torch.equal(mine, theirs) and not runner.guard.updates_at_step, step
        elif step > switch:  # the fallback's first iteration on: every update applied in time
            assert not runner.open, step
    assert deferred >= 4
    assert len(caught) == 1, caught
    assert f"iteration {switch}" in caught[0] and "module 'body.6'" in caught[0], caught[0]
    ours.session.close()


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet", "dear"])
def test_a_path_that_runs_no_hook_from_the_start_never_reads_a_pending_update(
        policy: str) -> None:
    """The loop calls a torch.jit.trace of the model (no Python module hook runs): found from
    the profiling steps, before anything is deferred; every iteration equals the plain
    optimizer's."""
    model, twin = _model(), _model()
    traced = torch.jit.trace(model, (_x(0),))
    ours, plain = _wrap(model, policy), torch.optim.SGD(twin.parameters(), lr=0.05)
    with pytest.warns(RuntimeWarning, match=r"reads parameters of modules '0', '2', '4', '6' "
                                            "without running"):
        for step in range(SETTLED + 4):
            mine, theirs = _step_both([(traced, ours), (twin, plain)], _called, step)
            assert torch.equal(mine, theirs), step
    runner = ours.session.modes.runner
    assert runner is not None and runner.active and runner.guard.updates_at_step
    assert not runner.open
    ours.session.close()


def test_a_parameter_read_without_its_module_is_applied_by_its_parent() -> None:
    """F.linear(x, self.body[-1].weight): the nearest module that ran applies it (runner_of),
    so the overlap stays and no warning comes."""
    model, twin = Bypassing(), Bypassing()
    model.bypass = twin.bypass = True
    ours, plain = _wrap(model, "bytescheduler"), torch.optim.SGD(twin.parameters(), lr=0.05)
    _keeps_deferring(ours, [(model, ours), (twin, plain)], split=True)
    ours.session.close()


def test_a_container_whose_inner_network_the_loop_calls_keeps_its_overlap() -> None:
    """model= a container, the loop calls its network: the groups sit on the network's modules
    (Note [The leading group runs at the root]), updates stay deferred, nothing is read late."""
    net, twin = _model(), _model()
    holder = nn.ModuleDict({"net": net})
    ours: Wrapped = commsched.DistributedOptimizer(  # type: ignore[assignment]
        torch.optim.SGD(net.parameters(), lr=0.05), model=holder, policy="bytescheduler",
        profile_steps=2, named_parameters=net.named_parameters())
    ours.session.never_pass_through()
    plain = torch.optim.SGD(twin.parameters(), lr=0.05)
    runner = _keeps_deferring(ours, [(net, ours), (twin, plain)])
    assert "" not in runner.modules.order and runner.modules.order[0] == "net"
    ours.session.close()
