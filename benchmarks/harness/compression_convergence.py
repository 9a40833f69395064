"""Convergence benchmark for lossy compression (issue 15, item 5): PowerSGD rank 1, 2, 4 and
top-k 1% and 10% against uncompressed training on scikit-learn's 8x8 digits (bundled, no
download), the same steps, each variant's learning rate tuned over one grid, several seeds.

The runs use commsched's DistributedOptimizer itself (the engine, the compressed plan, the
error feedback) in a world of one: compressors run there too (docs/compression.md), on the
whole batch. Every variant trains with SGD momentum 0.9, so top-k runs with Deep Gradient
Compression's momentum correction (issue 55; Note [DGC under the user's momentum] in
commsched/runtime/compression/dgc_momentum.py). Writes results.json and README.md to --out; the
uncompressed
run is the reference line of the table.

    python -m benchmarks.harness.compression_convergence --out benchmarks/compression_convergence
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

import commsched
from benchmarks.harness.kfac_convergence import Data, build_model, load_data
from commsched.bench.vision import resnet50
from commsched.compression import Compression

VARIANTS: dict[str, Any] = {
    "none": Compression.none,
    "powersgd-r1": Compression.powersgd(rank=1),
    "powersgd-r2": Compression.powersgd(rank=2),
    "powersgd-r4": Compression.powersgd(rank=4),
    "topk-1%": Compression.topk(ratio=0.01),
    "topk-10%": Compression.topk(ratio=0.1),
    # DGC's warm-up, as PowerSGD's start_step: the first steps uncompressed (the length of the
    # ResNet-50 report's lr warm-up), DGC's velocities then continuing from SGD's momentum.
    "topk-1%-warm40": Compression.topk(ratio=0.01, start_step=40),
    # DGC's sparsity warm-up over its 4 epochs (about 88 steps of batch 64 on these digits):
    # 25%, 6.25%, 1.5625% sent, then 1% from step 88.
    "topk-1%-ramp88": Compression.topk(ratio=0.01, warmup_steps=88),
}
LR_GRID = [0.02, 0.05, 0.1, 0.2]
# The real model's task: torchvision's ResNet-50 (layout of commsched.bench.vision, 23.5 M
# parameters, BatchNorm) on the same digits, upsampled to 16x16 and repeated on three channels,
# the smallest input that keeps every stage's spatial size at least 1 on a CPU step.
MODELS = ("cnn", "resnet50")
RESNET_INPUT = 16
EVAL_BATCH = 256


def model_data(name: str, data: Data) -> Data:
    """The digits as `name` takes them: as they are for the small CNN, 3x16x16 for ResNet-50."""
    if name == "cnn":
        return data

    def images(x: torch.Tensor) -> torch.Tensor:
        big = functional.interpolate(x, size=RESNET_INPUT, mode="bilinear", align_corners=False)
        return big.expand(-1, 3, -1, -1).contiguous()

    return Data(images(data.x_train), data.y_train, images(data.x_test), data.y_test)


def lr_factor(step: int, args: argparse.Namespace) -> float:
    """The learning rate's factor at `step`: constant, or a linear warm-up then a cosine decay
    to zero at the last step (ResNet-50 from scratch diverges at a constant lr that trains it)."""
    if args.schedule == "constant":
        return 1.0
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    done = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))


def build(name: str) -> torch.nn.Module:
    return build_model() if name == "cnn" else resnet50(num_classes=10)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Data) -> tuple[float, float]:
    """Full training-set loss and test accuracy, in eval mode (BatchNorm's running statistics),
    in batches so that ResNet-50's activations stay small."""
    model.eval()
    loss = sum(float(functional.cross_entropy(model(x), y, reduction="sum"))
               for x, y in zip(data.x_train.split(EVAL_BATCH), data.y_train.split(EVAL_BATCH),
                               strict=True)) / len(data.y_train)
    hits = sum(int((model(x).argmax(1) == y).sum())
               for x, y in zip(data.x_test.split(EVAL_BATCH), data.y_test.split(EVAL_BATCH),
                               strict=True))
    model.train()
    return loss, hits / len(data.y_test)


def train(variant: str, lr: float, seed: int, data: Data, args: argparse.Namespace
          ) -> dict[str, Any]:
    """One run: the seed fixes the initial weights and the batch order (the same for every
    variant). Returns the final full-training-set loss and test accuracy."""
    torch.manual_seed(seed)
    model = build(args.model)
    gen = torch.Generator().manual_seed(seed)
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        named_parameters=model.named_parameters(), compression=VARIANTS[variant],
        profile_steps=args.profile_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, args))
    n = data.x_train.shape[0]
    order, pos = torch.empty(0, dtype=torch.long), n
    began = time.perf_counter()
    try:
        for _ in range(args.steps):
            if pos + args.batch_size > n:
                order, pos = torch.randperm(n, generator=gen), 0
            idx = order[pos:pos + args.batch_size]
            pos += args.batch_size
            opt.zero_grad(set_to_none=True)
            functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
            opt.step()
            schedule.step()
        plan = opt.plan.policy
    finally:
        opt.session.close()
    loss, acc = evaluate(model, data)
    return {"variant": variant, "lr": lr, "seed": seed, "train_loss": loss,
            "test_acc": acc * 100, "plan": plan, "diverged": not math.isfinite(loss),
            "seconds": time.perf_counter() - began}


def _worker_init() -> None:
    """A worker process of `--jobs`: one thread, its own world of one."""
    torch.set_num_threads(1)
    commsched.init()


def train_all(jobs: list[tuple[str, float, int]], data: Data, args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    """Every (variant, lr, seed) run, in order: in this process, or over `args.jobs` worker
    processes (one core each; a run's result depends on its seed alone)."""
    if args.jobs <= 1:
        return [train(variant, lr, seed, data, args) for variant, lr, seed in jobs]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context,
                                                initializer=_worker_init) as pool:
        futures = [pool.submit(train, variant, lr, seed, data, args)
                   for variant, lr, seed in jobs]
        return [f.result() for f in futures]


# What makes one run's result; an earlier report's runs are reused only where all of it matches.
RUN_SETTINGS = ("steps", "batch_size", "profile_steps", "model", "schedule", "warmup_steps")


def load_resumed(path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs of an earlier report (`--resume`) made with this run's settings.

    Raises:
        SystemExit: a setting that makes a run's result differs from this run's.
    """
    earlier = json.loads(path.read_text())
    for key in RUN_SETTINGS:
        if earlier["settings"].get(key) != getattr(args, key):
            raise SystemExit(f"compression_convergence: --resume {path}: its {key} was "
                             f"{earlier['settings'].get(key)!r}, this run's is "
                             f"{getattr(args, key)!r}; its runs cannot be reused")
    return list(earlier["grid"])


def resume(jobs: list[tuple[str, float, int]], earlier: list[dict[str, Any]], data: Data,
           args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every run of `jobs`: those of `earlier` taken as they are, the others trained. The
    fastest reused run is trained again and must come out the same, or nothing is reused (a
    run's result depends on its seed alone; a change of code since would show here).

    Raises:
        SystemExit: the re-trained run differs from its earlier result.
    """
    known = {(r["variant"], r["lr"], r["seed"]): r for r in earlier}
    reused = [known[job] for job in jobs if job in known]
    if not reused:
        return train_all(jobs, data, args), {}
    check = min(reused, key=lambda r: r["seconds"])
    job = (check["variant"], check["lr"], check["seed"])
    todo = [j for j in jobs if j not in known]
    fresh = dict(zip([job, *todo], train_all([job, *todo], data, args), strict=True))
    again = fresh[job]
    if (again["test_acc"] != check["test_acc"]
            or not math.isclose(again["train_loss"], check["train_loss"], rel_tol=1e-6)):
        raise SystemExit(f"compression_convergence: --resume: {job} trained again gave loss "
                         f"{again['train_loss']:.6f} and accuracy {again['test_acc']:.2f}%, "
                         f"the earlier report {check['train_loss']:.6f} and "
                         f"{check['test_acc']:.2f}%; its runs cannot be reused")
    runs = [known[j] if j in known else fresh[j] for j in jobs]
    return runs, {"reused": len(reused), "checked": list(job)}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] if math.isfinite(r[key]) else math.inf for r in runs)


def _resumed_line(report: dict[str, Any]) -> str:
    resumed = report.get("resumed") or {}
    if not resumed:
        return ""
    variant, lr, seed = resumed["checked"]
    return (f"\n{resumed['reused']} runs were taken from `--resume`'s report, after its run of "
            f"{variant} at lr {lr:g}, seed {seed}, trained again here, came out the same.")


def write_readme(out: Path, report: dict[str, Any]) -> None:
    ref = report["best"]["none"]
    rows = ["| variant | plan | best lr | final train loss (median) | test acc (median, min-max) "
            "| vs uncompressed |", "|---|---|---:|---:|---:|---:|"]
    for name, best in report["best"].items():
        accs = [r["test_acc"] for r in best["runs"]]
        rows.append(f"| {name} | `{best['runs'][0]['plan']}` | {best['lr']:g} | "
                    f"{best['train_loss']:.4f} | {best['test_acc']:.2f}% ({min(accs):.2f}-"
                    f"{max(accs):.2f}) | {best['test_acc'] - ref['test_acc']:+.2f} pt |")
    s = report["settings"]
    task = ("digits 8x8" if s.get("model", "cnn") == "cnn"
            else f"ResNet-50 on digits at {RESNET_INPUT}x{RESNET_INPUT}")
    tuned = (f"each variant's lr tuned over {s['lrs']} by the median final training loss"
             if len(s["lrs"]) > 1 else f"every variant at lr {s['lrs'][0]:g}, untuned")
    schedule = ("" if s.get("schedule", "constant") == "constant" else
                f", {s['warmup_steps']} steps of linear warm-up then a cosine decay to zero")
    text = f"""# Compression convergence: {task}, a world of one

Command: `{report['command']}`; wall time {report['wall_seconds']:.0f} s.{_resumed_line(report)}
{s['steps']} steps of batch {s['batch_size']}, seeds {s['seeds']}, SGD momentum 0.9,
{tuned}{schedule}. Targets: PowerSGD rank 4
(issue 15) and top-k 1% and 10% (issue 55, top-k with DGC's momentum correction under the SGD
momentum) within 1 point of uncompressed test accuracy. A `-warm40` variant runs its first 40
steps uncompressed (`start_step=40`), then DGC's velocities continue from SGD's momentum. A
`-ramp88` variant has DGC's sparsity warm-up (`warmup_steps=88`, about 4 epochs): 25%, 6.25%
and 1.5625% of each tensor sent for 29-30 steps each, then 1%.

{chr(10).join(rows)}
"""
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", type=float, nargs="+", default=LR_GRID)
    p.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--model", choices=MODELS, default="cnn")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, in as many processes (at most one per core)")
    p.add_argument("--resume", type=Path,
                   help="an earlier results.json of the same settings: its runs are reused, "
                        "after its fastest reused run is trained again and matches")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    began = time.perf_counter()
    data = model_data(args.model, load_data(400, 0))
    args.out.mkdir(parents=True, exist_ok=True)
    commsched.init()
    jobs = [(variant, lr, seed) for variant in args.only for lr in args.lrs
            for seed in args.seeds]
    earlier = load_resumed(args.resume, args) if args.resume else []
    grid, resumed = resume(jobs, earlier, data, args)
    best = {}
    for variant in args.only:
        scored = []
        for lr in args.lrs:
            runs = [r for r in grid if r["variant"] == variant and r["lr"] == lr]
            scored.append((_median(runs, "train_loss"), lr, runs))
            print(f"{variant:12s} lr={lr:<6g} loss={scored[-1][0]:.4f}", flush=True)
        loss, lr, runs = min(scored, key=lambda t: (t[0], t[1]))
        best[variant] = {"lr": lr, "train_loss": loss, "test_acc": _median(runs, "test_acc"),
                         "runs": runs}
    report = {"command": "python -m benchmarks.harness.compression_convergence "
                         + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                             else argv)),
              "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "best": best, "grid": grid, "resumed": resumed, "torch": torch.__version__,
              "wall_seconds": time.perf_counter() - began}
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    if "none" in best:
        write_readme(args.out, report)
    print(f"compression_convergence: wrote {args.out} ({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
