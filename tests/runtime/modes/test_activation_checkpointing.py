"""Activation checkpointing (torch.utils.checkpoint, as a `transformers` model's
gradient_checkpointing_enable() uses it) under the overlap policies, in a world of one that
keeps stepping through the engine: the recomputed forward passes inside backward leave the
parameters where the plain optimizer leaves them, and are not timed as forward passes (Note
[Recomputed forward passes are not timed] in commsched/runtime/modes/overlap/module_profile.py)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import commsched

STEPS = 24
LOOP_S = 0.05  # the loop's own time between iterations (a data loader's, say)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class _Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        # Outside the checkpoints, as a Transformer's embedding: the blocks' inputs require
        # grad, without which reentrant checkpointing computes no gradient for them at all.
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([_Block() for _ in range(3)])
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def _net(reentrant: bool) -> _Net:
    torch.manual_seed(0)
    return _Net(reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("policy", ["bytescheduler", "prophet", "dear"])
def test_checkpointed_model_trains_as_the_plain_optimizer(policy: str, reentrant: bool) -> None:
    commsched.init()
    model, twin = _net(reentrant), _net(reentrant)
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model=model,
        named_parameters=model.named_parameters(), policy=policy, profile_steps=2)
    opt.session.never_pass_through()  # the path a world with peers takes
    plain = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    for step in range(STEPS):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        for net, optimizer in ((model, opt), (twin, plain)):
            optimizer.zero_grad()
            net(x).square().mean().backward()
            optimizer.step()
        time.sleep(LOOP_S)
    assert opt.plan.policy == policy and opt.session.mode.defers_updates
    opt.flush()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(),
                                                 strict=True))
    runner = opt.session.modes.runner
    assert runner is not None
    times = runner.modules.times
    # One time per recorded forward pass, as many as the root's: none from a recomputation,
    # and none that ran on into the next forward pass over backward, the step and the loop.
    assert len(times["blocks.0"]) == len(times[""]) >= 2, times
    assert statistics.median(times["blocks.0"]) < LOOP_S / 2, times
    opt.session.close()
