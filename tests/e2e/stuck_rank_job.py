"""Rank 1 gets stuck (alive, heartbeats beating) after the backward pass of step 4 and never
calls step(); rank 0's wait times out and its error, uncaught, names rank 1 and how it is stuck,
so that the launcher exits non-zero. Usage: stuck_rank_job.py POLICY"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

import commsched

TIMEOUT = 8.0
STUCK_S = 300.0  # far beyond the test's limit: only the launcher ends rank 1


def main() -> int:
    policy = sys.argv[1]
    torch.set_num_threads(1)
    rank = commsched.init().rank  # the world keeps the default timeout: start-up may be slow
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=2, timeout=TIMEOUT)
    for step in range(8):
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        if rank == 1 and step == 4:
            time.sleep(STUCK_S)
        opt.step()
    opt.flush()
    print(f"rank {rank} finished although rank 1 was stuck", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
