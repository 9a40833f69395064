"""Parity on the cluster testbed: every policy trains a replayed profile (commsched.bench.
profile_model) for the same steps from the same weights as torch DDP does, on the same
batches, and ends with DDP's parameters (overlap policies: after their last update is applied).
Run under torchrun, one agent per host (benchmarks/harness/testbed.py):

    scripts/cluster.sh run --hosts 2 --ranks-per-host 2 --rate 1gbit -- \\
        benchmarks/harness/cluster_parity.py --model profile:P.json?k=64 --out DIR

Every rank prints one line per policy; rank 0 writes DIR/parity.json. Exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import commsched
from commsched.bench.compare import make_optimizer
from commsched.bench.models import AnyModel, batch, build, loss_fn, model_argument
from commsched.torch_compat import ddp_kwargs

POLICIES = "horovod,ddp,mgwfbp,bytescheduler,prophet,dear,auto"


def train(name: AnyModel, policy: str | None, steps: int, rank: int) -> list[torch.Tensor]:
    """`steps` steps of SGD with momentum; `policy` None: torch DDP."""
    model = build(name)
    if policy is None:
        model = nn.parallel.DistributedDataParallel(model, **ddp_kwargs(sync_buffers=False))
        opt = make_optimizer("sgd", model)
    else:
        opt = commsched.DistributedOptimizer(make_optimizer("sgd", model),
                                             named_parameters=model.named_parameters(),
                                             model=model, policy=policy)
    for step in range(steps):
        x, y = batch(name, 2, step, rank)
        opt.zero_grad()
        loss_fn(name, model(x), y).backward()
        opt.step()
    getattr(opt, "flush", lambda: None)()
    return [p.detach().clone() for p in model.parameters()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=model_argument, required=True)
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = commsched.init()
    reference = train(args.model, None, args.steps, world.rank)
    rows = []
    for policy in args.policies.split(","):
        params = train(args.model, policy, args.steps, world.rank)
        diff = max(float((p - q).abs().max()) for p, q in zip(params, reference, strict=True))
        ok = diff <= args.tolerance
        rows.append({"policy": policy, "max_diff": diff, "ok": ok})
        print(f"rank {world.rank} policy {policy}: max diff from DDP {diff:.3g} "
              f"{'OK' if ok else 'FAIL'}", flush=True)
    if world.rank == 0 and args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "parity.json"), "w", encoding="utf-8") as handle:
            json.dump({"model": args.model.value, "world_size": world.size,
                       "steps": args.steps, "rows": rows}, handle, indent=1)
    dist.barrier()
    commsched.shutdown()
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
