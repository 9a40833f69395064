"""Models, data and training loops shared by the GPU tests (imported by the spawned ranks too)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

STEPS = 8
PROFILE_STEPS = 2
WIDTH = 256
# A stuck rank must fail with commsched's own error naming the wait (COMMSCHED_TIMEOUT), or else
# with every thread's stack from the helper (its timeout), before pytest's 300 s limit kills the
# test with neither: the H200 run of 2026-11-26 lost the two-rank test's cause that way.
RANK_ENV = {"COMMSCHED_TIMEOUT": "60"}
RANK_TIMEOUT_S = 200.0


def mlp(width: int = WIDTH, layers: int = 4) -> nn.Module:
    torch.manual_seed(7)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 10)).cuda()


def batch(step: int, rank: int, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, width, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    return x.cuda(), y.cuda()


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    x, y = batch(step, rank)
    return nn.functional.cross_entropy(model(x), y)


def base_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def train_wrapped(policy: str, rank: int, **knobs: Any) -> tuple[nn.Module, Any]:
    """STEPS steps of `policy` on this rank's batches; every deferred update applied."""
    import commsched

    model = mlp()
    opt = commsched.DistributedOptimizer(base_optimizer(model),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=PROFILE_STEPS, **knobs)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, step, rank).backward()
        opt.step()
    opt.flush()
    torch.cuda.synchronize()
    return model, opt


def train_plain(world: int = 1) -> nn.Module:
    """The reference: one process, each step's gradient the sum of every rank's (world 1: the
    plain optimizer)."""
    model = mlp()
    opt = base_optimizer(model)
    for step in range(STEPS):
        per_rank = []
        for rank in range(world):
            model.zero_grad(set_to_none=True)
            loss_of(model, step, rank).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
        for i, p in enumerate(model.parameters()):
            total = per_rank[0][i]
            for grads in per_rank[1:]:
                total = total + grads[i]
            p.grad = total
        opt.step()
    torch.cuda.synchronize()
    return model


def max_difference(ours: nn.Module, reference: nn.Module) -> float:
    return max(float((a.detach() - b.detach()).abs().max())
               for a, b in zip(ours.parameters(), reference.parameters(), strict=True))


def bit_equal(ours: nn.Module, reference: nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(ours.parameters(), reference.parameters(),
                                                 strict=True))
