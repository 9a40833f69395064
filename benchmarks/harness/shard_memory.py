"""Memory of shard_optimizer (issue 57, item 3): one job per model, mode and world size, so that
each process's peak RSS is that mode's alone.

Run under horovodrun (or torchrun). Each rank builds the model (benchmarks/real's reduced
inputs, full-size parameters), wraps Adam (two state tensors per parameter, the case sharding is
for) with `--mode`, trains `--steps` steps and reports the optimizer state it holds
(commsched.runtime.modes.shard_state.state_bytes: the wrapper's state and its slices; torch's
ZeroRedundancyOptimizer's local shard) and its peak RSS; rank 0 appends one JSON line to
`--out`. No profiling steps (profile_steps=0: dear plans from its defaults), because they run
unsharded and their whole state would set every mode's peak. scripts/bench_shard.sh runs the
jobs and writes the report.

    horovodrun -np 2 --gloo python -m benchmarks.harness.shard_memory --model resnet50 \\
        --mode sharded --out /tmp/memory.jsonl
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import commsched
from commsched.bench.compare import make_optimizer, zero_redundancy
from commsched.bench.models import MODEL_CHOICES, batch, build, loss_fn, model_argument
from commsched.runtime.modes.shard_state import state_bytes
from commsched.torch_compat import ddp_kwargs

MODES = ("plain", "sharded", "torch-zero")


def _wrap(mode: str, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
    if mode == "torch-zero":  # compare's torch-zero candidate
        ddp = nn.parallel.DistributedDataParallel(model, **ddp_kwargs(sync_buffers=False))
        return ddp, zero_redundancy("adam", model)
    opt = commsched.DistributedOptimizer(make_optimizer("adam", model),
                                         named_parameters=model.named_parameters(),
                                         policy="dear", model=model, profile_steps=0,
                                         shard_optimizer=mode == "sharded")
    return model, opt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=model_argument, required=True,
                        help=f"{', '.join(m.value for m in MODEL_CHOICES)}, hf:... or tv:...")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True, help="JSON lines file rank 0 appends to")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = commsched.init()
    model = build(args.model)
    params = sum(p.numel() for p in model.parameters())
    runner, opt = _wrap(args.mode, model)
    began = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.model, args.batch_size, step, world.rank)
        opt.zero_grad()
        loss_fn(args.model, runner(x), y).backward()
        opt.step()
    getattr(opt, "flush", lambda: None)()
    held = torch.tensor([float(state_bytes(opt)),
                         float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)])
    gathered = [torch.zeros_like(held) for _ in range(world.size)]
    if world.size > 1:
        dist.all_gather(gathered, held)
    else:
        gathered = [held]
    if world.rank == 0:
        row = {"model": args.model.value, "mode": args.mode, "ranks": world.size,
               "parameters": params, "steps": args.steps,
               "seconds": round(time.perf_counter() - began, 1),
               "state_bytes": [int(g[0]) for g in gathered],
               "peak_rss_bytes": [int(g[1]) for g in gathered],
               "torch": torch.__version__}
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
