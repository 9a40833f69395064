"""Python function calls per training iteration in a world of one, in total and in commsched's
own code (cProfile's call counts): a measure of the per-iteration bookkeeping that, unlike a
timing, does not move with the machine's noise. Not a speed claim: the overhead benchmark
(scripts/bench_overhead.sh) is that.

    .venv/bin/python scripts/python_calls.py [--models mlp transformer] [--policies ...]
        [--warmup N] [-v]

With `--warmup 110` it counts past the iteration where a world of one steps as the plain
optimizer (about 80 for every policy, 100 for `auto`), the state the overhead benchmark times.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

import commsched
from commsched.bench.models import ModelName, batch, build, loss_fn

WARMUP, MEASURED = 40, 40  # past the profiling steps of every policy (default profile_steps)


def calls_per_iteration(model_name: ModelName, policy: str, warmup: int = WARMUP,
                        engine_kept: bool = False) -> tuple[float, float, pstats.Stats]:
    torch.manual_seed(0)
    model = build(model_name)
    opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if policy != "plain":
        opt = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                             model=model, policy=policy)
        if engine_kept:  # as the overhead benchmark's "<policy> (engine kept)"
            opt.session.never_pass_through()  # type: ignore[attr-defined]
    x, y = batch(model_name, 4, 0, rank=0)

    def iteration() -> None:
        opt.zero_grad()
        loss_fn(model_name, model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        iteration()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(MEASURED):
        iteration()
    profile.disable()
    stats = pstats.Stats(profile)
    counts = stats.stats  # type: ignore[attr-defined]
    total = sum(v[1] for v in counts.values())
    ours = sum(v[1] for k, v in counts.items() if _ours(k[0]))
    return total / MEASURED, ours / MEASURED, stats


def _ours(filename: str) -> bool:
    return "commsched" in filename and "/bench/" not in filename


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"])
    parser.add_argument("--policies", nargs="+",
                        default=["plain", "horovod", "bytescheduler", "dear"])
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help=f"iterations before counting (default {WARMUP})")
    parser.add_argument("--engine-kept", action="store_true",
                        help="keep the engine (and an overlap runner) past warm-up, as a world "
                             "with peers does: the overhead benchmark's '(engine kept)'")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list commsched's functions by calls per iteration")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | policy | Python calls / iteration | of them in commsched |")
    print("|---|---|---:|---:|")
    for name in args.models:
        for policy in args.policies:
            total, ours, stats = calls_per_iteration(ModelName(name), policy, args.warmup,
                                                     args.engine_kept)
            print(f"| {name} | {policy} | {total:.0f} | {ours:.1f} |")
            if args.verbose:
                counts = stats.stats  # type: ignore[attr-defined]
                for (path, line, func), v in sorted(counts.items(), key=lambda kv: -kv[1][1]):
                    if _ours(path):
                        print(f"    {v[1] / MEASURED:6.1f}  {path.split('commsched/')[-1]}:{line}"
                              f" {func}")


if __name__ == "__main__":
    main()
