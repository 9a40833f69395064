"""Runs under ``torchrun --max-restarts=1`` (test_torchrun.py): trains STEPS steps, saving a
checkpoint (model and wrapped optimizer state, whose ``commsched`` entry holds the plan and the
iteration) every SAVE_EVERY steps, and resumes from the last one when it starts.

Usage: torchrun_restart_job.py DIR FAIL_AT
    DIR      receives `ckpt.pt` (written by rank 0), `final.rank<r>.pt` (parameters and the
             plans each step ran) and `events.jsonl` (starts and resumes)
    FAIL_AT  on torchrun's first attempt, rank 1 exits with status 3 at the start of that step
             (torchrun then restarts every worker); -1 for never
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import commsched

STEPS, SAVE_EVERY, PROFILE_STEPS = 12, 3, 2
# mgwfbp merges a gradient into the block before it when it is ready within alpha of that
# block's start. Its plan is otherwise built from measured ready times, so the uninterrupted
# job and the restarted one (each profiling on its own) could choose different fusion
# boundaries on a loaded machine, and then different float sums. With alpha far above the
# backward pass, every profile gives one block, which still differs from the profiling plan:
# a resumed job that profiled again would show it in its plans and its parameters.
ALPHA_S = 1.0


def make_model() -> nn.Module:
    torch.manual_seed(8)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 2))


def event(out_dir: str, **fields: object) -> None:
    with open(os.path.join(out_dir, "events.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(fields) + "\n")


def main(out_dir: str, fail_at: int) -> int:
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = commsched.init().rank
    model = make_model()
    opt = commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         policy="mgwfbp", profile_steps=PROFILE_STEPS,
                                         alpha=ALPHA_S)
    path = os.path.join(out_dir, "ckpt.pt")
    start = 0
    if os.path.exists(path):  # every rank loads the same file
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            event(out_dir, attempt=attempt, resumed_at=start,
                  plan=state["optimizer"]["commsched"]["plan"]["fingerprint"])
    elif rank == 0:
        event(out_dir, attempt=attempt, started=True)
    plans = []
    for step in range(start, STEPS):
        if step == fail_at and attempt == 0 and rank == 1:
            return 3
        gen = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(8, 10, generator=gen)),
                               torch.randn(8, 2, generator=gen)).backward()
        plans.append(opt.plan.fingerprint)
        opt.step()
        if (step + 1) % SAVE_EVERY == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "step": step + 1}
            if rank == 0:
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)  # a worker stopped mid-write leaves the old one
            dist.barrier()  # the checkpoint is on disk before any rank goes on
    torch.save({"params": [p.detach() for p in model.parameters()], "plans": plans,
                "start": start}, os.path.join(out_dir, f"final.rank{rank}.pt"))
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
