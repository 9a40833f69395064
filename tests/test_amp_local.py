"""GradScaler in a world of one: the wrapper steps as the plain optimizer under the scaler,
before and after it passes through (Note [GradScaler asks before it unscales])."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import commsched
from commsched.runtime.modes import ModeKind

STEPS = 100  # past the iteration where a world of one passes through (about 80)
OVERFLOW = 7


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def _train(wrap: bool, optimizer: str, recipe: str) -> tuple[list[torch.Tensor], list[float]]:
    """The parameters and scales after STEPS steps, wrapped (and then passing through) or
    plain."""
    model = _model()
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) \
        if optimizer == "sgd" else torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    if wrap:
        opt = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                             model=model, policy="bytescheduler",
                                             profile_steps=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=10)
    scales = []
    for step in range(STEPS):
        opt.zero_grad()
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x * (1e6 if step == OVERFLOW else 1)).float(), y)
        scaler.scale(loss).backward()
        if recipe == "horovod" and wrap:
            opt.synchronize()  # type: ignore[attr-defined]
            scaler.unscale_(opt)
            with opt.skip_synchronize():  # type: ignore[attr-defined]
                scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    if wrap:
        assert opt.session.mode.kind is ModeKind.PLAIN  # type: ignore[attr-defined]
        opt.session.close()  # type: ignore[attr-defined]
    return [p.detach() for p in model.parameters()], scales


@pytest.mark.parametrize("recipe", ["ddp", "horovod"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_grad_scaler_steps_as_the_plain_optimizer(optimizer: str, recipe: str) -> None:
    plain, plain_scales = _train(False, optimizer, recipe)
    ours, scales = _train(True, optimizer, recipe)
    assert scales == plain_scales
    assert scales[OVERFLOW] == scales[OVERFLOW - 1] / 2  # the overflow was seen and skipped
    for p, q in zip(ours, plain, strict=True):
        assert torch.equal(p, q), float((p - q).abs().max())


def test_a_disabled_scaler_calls_the_plain_step() -> None:
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    model(torch.randn(4, 6)).sum().backward()
    scaler.step(opt)
    assert "found_inf" not in vars(opt) and "grad_scale" not in vars(opt)
    opt.zero_grad()  # nothing pending: step() reduced and stepped
    opt.session.close()
