"""Rank 1 dies abruptly (os._exit) in the backward pass of step 4; the other ranks must fail
with an error naming it, so that the launcher exits non-zero. Usage: dead_rank_job.py POLICY"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import commsched


def main() -> int:
    policy = sys.argv[1]
    torch.set_num_threads(1)
    rank = commsched.init().rank
    torch.manual_seed(0)
    first = nn.Linear(16, 32)
    model = nn.Sequential(first, nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=2, timeout=20)
    at = {"step": 0}
    if rank == 1:
        first.weight.register_hook(lambda g: os._exit(3) if at["step"] >= 4 else None)
    for step in range(8):
        at["step"] = step
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
    opt.flush()
    print(f"rank {rank} finished although rank 1 died", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
