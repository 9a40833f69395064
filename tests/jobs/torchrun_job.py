"""Runs under ``torchrun --nproc_per_node=N``: trains with every synchronous policy and checks
the parameters against a single-process reference that averages all ranks' gradients itself.
Prints one line per policy and exits non-zero on any mismatch."""

from __future__ import annotations

import sys

import torch
from torch import nn

import commsched


def data(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(31 * step + rank)
    return torch.randn(8, 10, generator=gen), torch.randn(8, 2, generator=gen)


def make_model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 2))


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    x, y = data(step, rank)
    return nn.functional.mse_loss(model(x), y)


def reference(world: int, steps: int) -> list[torch.Tensor]:
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        opt.zero_grad()
        total = sum((loss_of(model, step, r) for r in range(world)), torch.zeros(()))
        (total / world).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def main() -> int:
    torch.set_num_threads(1)
    world = commsched.init()
    assert world.launcher.value == "torchrun", world.launcher
    failures = 0
    for policy in ["horovod", "ddp", "mgwfbp"]:
        model = make_model()
        opt = commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters(),
                                             policy=policy, profile_steps=2)
        for step in range(6):
            opt.zero_grad()
            loss_of(model, step, world.rank).backward()
            opt.step()
        expected = reference(world.size, 6)
        diff = max(float((p.detach() - q).abs().max())
                   for p, q in zip(model.parameters(), expected, strict=True))
        ok = diff < 1e-5
        failures += not ok
        print(f"rank {world.rank} policy {policy}: max diff {diff:.3g} {'OK' if ok else 'FAIL'}",
              flush=True)
    commsched.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
