"""A world of one that has settled on its plan steps as the plain optimizer, as
Horovod's does at size 1 (runtime/modes/plain.py, Note [A world of one steps as the plain
optimizer]): the same parameters as the plain optimizer throughout, no gradient handed over
once it passes through, hooked again by whatever changes the passes or the plan, and never where
it would change what the user sees."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched.runtime.modes import ModeKind

STEPS = 120  # horovod and mgwfbp pass through after 78 iterations, ddp after 64
OVERLAP = ["bytescheduler", "prophet", "dear"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _pair(**kw: Any) -> tuple[nn.Module, Any, nn.Module, torch.optim.Optimizer]:
    model, twin = _model(), _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(), model=model, **kw)
    return model, opt, twin, torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)


def _batch(step: int) -> torch.Tensor:
    return torch.randn(5, 3, generator=torch.Generator().manual_seed(step))


def _steps(model: nn.Module, opt: Any, twin: nn.Module, plain: torch.optim.Optimizer,
           steps: range, passes: int = 1) -> int | None:
    """Trains both side by side; the first step after which `opt` passed through."""
    first = None
    for step in steps:
        for m, o in ((model, opt), (twin, plain)):
            o.zero_grad()
            for _ in range(passes):
                m(_batch(step)).square().sum().backward()
            o.step()
        if first is None and opt.session.mode.kind is ModeKind.PLAIN:
            first = step
    return first


def _same(model: nn.Module, twin: nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(),
                                                 strict=True))


def _reload_and_step(model: nn.Module, opt: Any, twin: nn.Module,
                     plain: torch.optim.Optimizer) -> None:
    """Both load their own checkpoint and step once: ours through its hooks again (an overlap
    plan's runner too)."""
    opt.load_state_dict(opt.state_dict())
    plain.load_state_dict(plain.state_dict())
    runner = opt.session.modes.runner
    assert opt.session.mode.kind is not ModeKind.PLAIN
    assert runner is None or (opt.session.mode.defers_updates and runner._handles)
    model(_batch(0)).square().sum().backward()
    assert opt.session.accumulation.pending  # handed over by the hook again
    opt.step()
    twin(_batch(0)).square().sum().backward()
    plain.step()
    assert _same(model, twin)


@pytest.mark.parametrize("policy", ["horovod", "ddp", "mgwfbp", *OVERLAP])
def test_a_settled_world_of_one_steps_as_the_plain_optimizer(policy: str) -> None:
    commsched.init()
    model, opt, twin, plain = _pair(policy=policy)
    first = _steps(model, opt, twin, plain, range(STEPS))
    assert first is not None and first < STEPS - 10, first
    assert _same(model, twin)  # an overlap plan's last update, too: made at step() now
    assert opt.plan.policy == policy  # the plan stays (what a checkpoint or a profile shows)
    assert opt.session.state.iteration == STEPS  # still counted (checkpoints keep it)
    model(_batch(0)).square().sum().backward()
    assert not opt.session.accumulation.pending  # no hook took the gradient: none handed over
    opt.step()


def test_no_hook_is_left_on_a_parameter_but_the_users_own() -> None:
    # Note [An empty hook dict still costs a call]: torch's hook object goes where ours was the
    # last hook; a hook of the user's stays and keeps firing.
    commsched.init()
    model, opt, twin, plain = _pair(policy="horovod")
    last = list(model.parameters())[-1]
    fired: list[int] = []
    last.register_post_accumulate_grad_hook(lambda p: fired.append(1))
    assert _steps(model, opt, twin, plain, range(STEPS)) is not None
    others = list(model.parameters())[:-1]
    assert all(p._post_accumulate_grad_hooks is None for p in others)
    hooks = last._post_accumulate_grad_hooks
    assert hooks is not None and len(hooks) == 1
    fired.clear()
    model(_batch(0)).square().sum().backward()
    assert fired == [1] and not opt.session.accumulation.pending
    opt.step()
    opt.set_backward_passes_per_step(1)  # hooked again: ours and the user's
    opt.zero_grad()
    model(_batch(1)).square().sum().backward()
    assert fired == [1, 1] and opt.session.accumulation.pending
    opt.step()


@pytest.mark.parametrize("policy", OVERLAP)
def test_an_overlap_plan_stands_down_and_comes_back(policy: str) -> None:
    # Its runner's hooks go at the switch; whatever hooks the gradients again puts them back,
    # and step() defers its update again (two passes per step keep it there), to the same
    # parameters.
    commsched.init()
    model, opt, twin, plain = _pair(policy=policy)
    assert _steps(model, opt, twin, plain, range(STEPS)) is not None
    runner = opt.session.modes.runner
    assert not opt.session.mode.defers_updates and not runner._handles
    assert opt.state_dict()["commsched"]["runner"]["active"]  # what a restored run resumes
    opt.set_backward_passes_per_step(2)
    assert opt.session.mode.defers_updates and runner._handles
    assert _steps(model, opt, twin, plain, range(STEPS, STEPS + 5), passes=2) is None
    assert runner.open  # the last update waits for the next forward pass
    opt.flush()
    assert _same(model, twin)
    opt.set_backward_passes_per_step(1)
    assert _steps(model, opt, twin, plain, range(STEPS, STEPS + 2)) is not None
    _reload_and_step(model, opt, twin, plain)


def test_auto_passes_through_once_it_has_decided_without_trials() -> None:
    # Its synchronous plans all do the same work in a world of one: nothing to measure.
    commsched.init()
    model, opt, twin, plain = _pair(policy="auto")
    first = _steps(model, opt, twin, plain, range(STEPS + 30))
    assert first is not None and opt.auto is not None and opt.auto.settled
    assert "trial" not in [entry["why"] for entry in opt.auto.history]
    assert _same(model, twin)


def test_changing_the_passes_hooks_the_gradients_again() -> None:
    commsched.init()
    model, opt, twin, plain = _pair(policy="horovod")
    assert _steps(model, opt, twin, plain, range(STEPS)) is not None
    model(_batch(0)).square().sum().backward()  # before the change: left in p.grad
    opt.set_backward_passes_per_step(1)
    assert opt.session.mode.kind is not ModeKind.PLAIN
    twin(_batch(0)).square().sum().backward()
    opt.step()  # hands over what no hook did
    plain.step()
    assert _same(model, twin)
    opt.set_backward_passes_per_step(2)
    assert _steps(model, opt, twin, plain, range(STEPS, STEPS + 20), passes=2) is None
    assert _same(model, twin)
    opt.zero_grad()
    model(_batch(0)).sum().backward()
    model(_batch(1)).sum().backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        model(_batch(2)).sum().backward()  # the hooks count the passes again


def test_loading_a_checkpoint_hooks_the_gradients_again() -> None:
    commsched.init()
    model, opt, twin, plain = _pair(policy="horovod")
    assert _steps(model, opt, twin, plain, range(STEPS)) is not None
    _reload_and_step(model, opt, twin, plain)
    assert _steps(model, opt, twin, plain, range(STEPS)) is not None  # and passes through again
    assert _same(model, twin)


class _Unused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.spare = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _never(tmp_path: pathlib.Path, case: str) -> Any:
    torch.manual_seed(0)
    model: nn.Module = _Unused() if "without a gradient" in case else _model()
    kw: dict[str, Any] = {"policy": "horovod"}
    if case == "an overlap plan with a parameter without a gradient":
        kw = {"policy": "bytescheduler", "model": model}
    elif case == "a timeline":
        kw["timeline"] = str(tmp_path / "timeline.json")
    elif case == "PowerSGD":
        kw["compression"] = commsched.Compression.powersgd(min_ratio=1.0)
    elif case == "two passes per step":
        kw["backward_passes_per_step"] = 2
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), **kw)
    for step in range(STEPS):
        opt.zero_grad()
        for _ in range(opt.backward_passes_per_step):
            model(_batch(step)).square().sum().backward()
        opt.step()
    return opt


@pytest.mark.parametrize("case", ["a parameter without a gradient",
                                  "an overlap plan with a parameter without a gradient",
                                  "a timeline", "PowerSGD", "two passes per step"])
def test_nothing_the_user_sees_changes_where_it_would_matter(tmp_path: pathlib.Path,
                                                             case: str) -> None:
    commsched.init()
    opt = _never(tmp_path, case)
    assert opt.session.mode.kind is not ModeKind.PLAIN, case
    opt.session.close()
