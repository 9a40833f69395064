"""Rank 1 fails at step 4 and the other rank must fail with an error naming it, so that the
launcher exits non-zero. Usage: dead_rank_job.py POLICY [dead|stuck] [TAG]; TAG, unread, names
the test that started the job on its command line (launch.run_tag).

* dead: rank 1 dies abruptly (os._exit(3)) in the backward pass of step 4;
* stuck: rank 1 stays alive (heartbeats beating) after the backward pass of step 4 and never
  calls step(); rank 0's wait times out and its error, uncaught, names rank 1 and how it is
  stuck.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn

import commsched

STUCK_TIMEOUT = 8.0  # COMMSCHED_TIMEOUT of the stuck case
STUCK_S = 300.0  # far beyond the test's limit: only the launcher ends rank 1


def main() -> int:
    policy = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "dead"
    torch.set_num_threads(1)
    rank = commsched.init().rank  # the world keeps the default timeout: start-up may be slow
    torch.manual_seed(0)
    first = nn.Linear(16, 32)
    model = nn.Sequential(first, nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        model=model, policy=policy, profile_steps=2,
        timeout=STUCK_TIMEOUT if mode == "stuck" else 20)
    at = {"step": 0}
    if rank == 1 and mode == "dead":
        first.weight.register_hook(lambda g: os._exit(3) if at["step"] >= 4 else None)
    for step in range(8):
        at["step"] = step
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        if rank == 1 and mode == "stuck" and step == 4:
            time.sleep(STUCK_S)
        opt.step()
    opt.flush()
    print(f"rank {rank} finished although rank 1 was {mode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
