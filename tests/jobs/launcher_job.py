"""One training job for every launcher (test_launchers.py): each rank trains the same model on
its own batches under a few policies, then runs the collectives a script calls on its own
tensors, and writes what its world was, its final parameters and those results to
OUT_DIR/rank{R}.pt. Run as ``LAUNCHER python launcher_job.py OUT_DIR [OPTION]``:
``--horovod`` imports horovod.torch and calls hvd.init() first, as a Horovod script does;
``--own-group`` makes torch.distributed's group itself from the launcher's rank and size, as
Lightning or Accelerate would; ``--no-horovod`` makes horovod unimportable, as where it is not
installed. A failure to form the world is written to OUT_DIR/rank{R}.error.

The policies are deterministic for a given world: `ddp` rebuilds its buckets from the observed
ready order of rank 0, `dear` groups by forward order, so every launcher's job ends with the
same parameters as the torchrun job's, to the bit."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

POLICIES = ("ddp", "dear")
STEPS = 6


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(97 * step + rank)
    return torch.randn(8, 12, generator=gen), torch.randn(8, 3, generator=gen)


def train(policy: str, rank: int) -> list[torch.Tensor]:
    import commsched

    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 3))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), model=model, policy=policy, profile_steps=2)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.flush()
    out = [p.detach().clone() for p in model.parameters()]
    opt.session.close()
    return out


def calls(rank: int) -> dict[str, Any]:
    """Horovod's calls on a script's own tensors (a metric, a seed) and its host layout."""
    import commsched

    value = torch.tensor([1.0 + rank, 10.0 * rank])
    return {"average": commsched.allreduce(value),
            "sum": commsched.allreduce(value, op=commsched.Sum),
            "sum_flag": commsched.allreduce(value, average=False),
            "gathered": commsched.allgather(torch.full((rank + 1, 2), float(rank))),
            "broadcast": commsched.broadcast(torch.tensor([float(rank)]), root_rank=1),
            "layout": (commsched.local_size(), commsched.cross_rank(), commsched.cross_size())}


def own_group() -> None:
    """The group a framework would make before commsched: from Open MPI's rank and size."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['JOB_PORT']}",
                            rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                            world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))


def main(out_dir: str, option: str) -> None:
    torch.set_num_threads(1)
    if option == "--horovod":
        import horovod.torch as hvd

        hvd.init()
    elif option == "--own-group":
        own_group()
    elif option == "--no-horovod":
        sys.modules["horovod"] = None  # type: ignore[assignment]
    import commsched

    try:
        world = commsched.init()
    except commsched.LauncherError as err:
        rank = next((os.environ[k] for k in ("OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK")
                     if k in os.environ), "0")
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w", encoding="utf-8") as handle:
            handle.write(str(err))
        raise
    result = {"rank": world.rank, "size": world.size, "local_rank": world.local_rank,
              "launcher": world.launcher.value, "store_address": world.store_address,
              "params": {policy: train(policy, world.rank) for policy in POLICIES},
              "calls": calls(world.rank)}
    torch.save(result, os.path.join(out_dir, f"rank{world.rank}.pt"))
    commsched.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
