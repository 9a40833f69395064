"""Soak run: many steps of one policy; resident memory, threads and open files are sampled
every `--every` steps, and the job must shut down cleanly. Run under horovodrun or torchrun:

    horovodrun -np 2 --gloo python -m benchmarks.harness.soak --steps 2000 --out benchmarks/soak
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import torch

import commsched
from commsched.bench.compare import typed_command
from commsched.bench.models import ModelName, batch, build, loss_fn

# Memory counts as flat when the last sample is within this fraction of the first one taken
# after warm-up (the 5%).
FLAT = 0.05


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def sample(step: int) -> dict:
    return {"step": step, "rss_mib": rss_bytes() / 2**20, "threads": os_threads(),
            "python_threads": threading.active_count(), "open_files": open_files()}


def soak(policy: str, model_name: ModelName, steps: int, every: int, batch_size: int) -> list[dict]:
    rank = commsched.rank()
    model = build(model_name)
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy)
    samples = []
    for step in range(steps):
        x, y = batch(model_name, batch_size, step, rank)
        opt.zero_grad()
        loss_fn(model_name, model(x), y).backward()
        opt.step()
        if step % every == 0 or step == steps - 1:
            samples.append(sample(step))
    opt.flush()
    return samples


def verdict(samples: list[dict], warmup_steps: int) -> dict:
    settled = [s for s in samples if s["step"] >= warmup_steps]
    first, last = settled[0], settled[-1]
    growth = (last["rss_mib"] - first["rss_mib"]) / first["rss_mib"]
    return {"rss_first_mib": first["rss_mib"], "rss_last_mib": last["rss_mib"],
            "rss_max_mib": max(s["rss_mib"] for s in settled), "rss_growth": growth,
            "rss_flat": abs(growth) <= FLAT,
            "threads_steady": len({s["threads"] for s in settled}) == 1,
            "open_files_steady": len({s["open_files"] for s in settled}) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="bytescheduler")
    parser.add_argument("--model", type=ModelName, default=ModelName.MLP, choices=list(ModelName))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=200, help="steps before memory must be flat")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = commsched.init()
    start = time.perf_counter()
    samples = soak(args.policy, args.model, args.steps, args.every, args.batch_size)
    elapsed = time.perf_counter() - start
    per_rank = world.all_gather_object({"samples": samples,
                                        "verdict": verdict(samples, args.warmup)})
    threads_before_shutdown = os_threads()
    commsched.shutdown()
    # After shutdown the engine's threads must be gone; Horovod's and torch's own stay.
    after = {"threads_before_shutdown": threads_before_shutdown,
             "threads_after_shutdown": os_threads()}
    if world.rank == 0:
        report = {"command": typed_command("benchmarks.harness.soak", argv),
                  "args": vars(args) | {"model": args.model.value}, "world_size": world.size,
                  "elapsed_s": elapsed, "ranks": per_rank, "rank0_shutdown": after}
        verdicts = {r: p["verdict"] for r, p in enumerate(per_rank)}
        print(json.dumps(verdicts | {"shutdown": after}, indent=1))
        if args.out:
            write(args.out, report)
    return 0


def write(out: str, report: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    for rank, data in enumerate(report["ranks"]):
        steps = [s["step"] for s in data["samples"]]
        for ax, key in zip(axes, ("rss_mib", "threads", "open_files"), strict=True):
            ax.plot(steps, [s[key] for s in data["samples"]], label=f"rank {rank}")
            ax.set_title(key)
            ax.set_xlabel("step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "results.png"), dpi=110)
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown(report))


def markdown(report: dict) -> str:
    args = report["args"]
    lines = [f"# Soak: {args['steps']:,} steps of `{args['policy']}` on "
             f"{report['world_size']} ranks", "",
             f"Command: `scripts/soak.sh` (runs `{report['command']}` under "
             "`horovodrun -np 2 --gloo`); "
             f"model {args['model']}, batch {args['batch_size']}, samples every {args['every']} "
             f"steps, memory must be flat after step {args['warmup']}. "
             f"Wall time {report['elapsed_s']:.1f} s.", "",
             "| rank | RSS after warm-up MiB | RSS at the end MiB | max MiB | growth | flat (<=5%) "
             "| threads steady | open files steady |", "|---|---:|---:|---:|---:|---|---|---|"]
    yes = {True: "yes", False: "no"}
    for rank, data in enumerate(report["ranks"]):
        v = data["verdict"]
        lines.append(f"| {rank} | {v['rss_first_mib']:.1f} | {v['rss_last_mib']:.1f} "
                     f"| {v['rss_max_mib']:.1f} | {100 * v['rss_growth']:.2f}% "
                     f"| {yes[v['rss_flat']]} | {yes[v['threads_steady']]} "
                     f"| {yes[v['open_files_steady']]} |")
    down = report["rank0_shutdown"]
    lines += ["", f"Rank 0 OS threads: {down['threads_before_shutdown']} before "
              f"`commsched.shutdown()`, {down['threads_after_shutdown']} after (the engine and "
              "completion threads are joined; the rest belong to Horovod and torch).", "",
              "![soak](results.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
