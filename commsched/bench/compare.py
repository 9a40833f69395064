"""Side-by-side comparison: hvd.DistributedOptimizer, PyTorch DDP and commsched's policies on one
model (built-in, or ResNet-50, VGG-16, BERT or GPT-2 at full size), in one job, candidates
interleaved round by round so that machine noise hits all of them alike. Run under
``horovodrun -np N --gloo``; prints a table of median iteration times and ratios on rank 0 and
optionally writes JSON, markdown and a PNG.

    horovodrun -np 2 --gloo python -m commsched.bench.compare --model cnn
    horovodrun -np 2 --gloo python -m commsched.bench.compare --model gpt2 --batch-size 1
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import commsched

from ..outputs import OutputPathError, prepare_dir
from ..runtime.modes.shard_state import state_bytes
from ..torch_compat import ddp_kwargs
from ..world.errors import import_horovod
from .candidate import LOCAL, Candidate, parse_candidate
from .compare_report import bound_lines, markdown_table, write_outputs
from .compressed_candidates import (
    HVD_FP16,
    candidate_bytes,
    ddp_powersgd_kwargs,
    parse_ddp_powersgd,
    register_ddp_powersgd,
    split_compression,
)
from .cpu_meter import CPU_BOUND, CpuMeter
from .models import (
    MODEL_CHOICES,
    AnyModel,
    batch,
    build,
    ddp_bucket_kwargs,
    loss_fn,
    model_argument,
    optimizer_class,
)

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-4}),
}
ZERO = "torch-zero"  # DDP with torch's ZeroRedundancyOptimizer (whole parameters, broadcast)


def source_commit() -> str | None:
    """The git commit commsched runs from (``+dirty`` with uncommitted changes to the package or
    its C++ sources), or None outside a git checkout: a committed report says which code
    measured it."""
    here = os.path.dirname(os.path.abspath(commsched.__file__))
    git = ["git", "-C", os.path.dirname(here)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--",
                                "commsched", "csrc"],
                               capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head.strip() + ("+dirty" if dirty.strip() else "")


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    """Every candidate's optimizer (OPTIMIZERS[kind]) over `model`'s parameters."""
    cls, settings = OPTIMIZERS[kind]
    return optimizer_class(model, cls)(model.parameters(), **settings)


def zero_redundancy(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    """The same optimizer as torch's ZeroRedundancyOptimizer: each rank owns whole parameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls, settings = OPTIMIZERS[kind]
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class(model, cls),
                                   **settings)


def _stepper(name: AnyModel, model: nn.Module, opt: torch.optim.Optimizer, batch_size: int,
             rank: int) -> Callable[[int], None]:
    def step(i: int) -> None:
        x, y = batch(name, batch_size, i, rank)
        opt.zero_grad()
        loss_fn(name, model(x), y).backward()
        opt.step()
    return step


def make_candidates(name: AnyModel, wanted: list[str], batch_size: int,
                    predict: bool = False, profile_dir: str = "",
                    optimizer: str = "sgd") -> list[Candidate]:
    """The candidates to time; with `predict`, the commsched ones are simulated afterwards from
    their profiles, which `profile_dir` (if given) also keeps as files. Horovod is imported only
    for its own candidates (a side venv without it runs the others)."""
    rank = commsched.rank()
    out = []
    for index, label in enumerate(wanted):
        model = build(name)
        predicted = False
        powersgd = parse_ddp_powersgd(label)
        if label in ("hvd", HVD_FP16):
            hvd = import_horovod(f"the benchmark candidate {label!r} is Horovod's own "
                                 "DistributedOptimizer,")
            opt = hvd.DistributedOptimizer(make_optimizer(optimizer, model),
                                           named_parameters=model.named_parameters(),
                                           compression=hvd.Compression.fp16 if label == HVD_FP16
                                           else hvd.Compression.none)
        elif label in ("torch-ddp", ZERO) or powersgd is not None:
            # Horovod does not synchronise buffers either; keep the comparison like for like.
            model = nn.parallel.DistributedDataParallel(model, **ddp_kwargs(sync_buffers=False),
                                                        **ddp_powersgd_kwargs(powersgd),
                                                        **ddp_bucket_kwargs(name))
            if powersgd is not None:
                register_ddp_powersgd(model, powersgd)
            opt = (zero_redundancy if label == ZERO else make_optimizer)(optimizer, model)
        elif label == LOCAL:
            opt = make_optimizer(optimizer, model)
        else:
            policy, knobs = parse_candidate(label)
            predicted = predict
            if profile_dir:
                knobs["profile"] = os.path.join(profile_dir, f"candidate{index}.json")
            compression, knobs = split_compression(knobs)
            opt = commsched.DistributedOptimizer(make_optimizer(optimizer, model),
                                                 named_parameters=model.named_parameters(),
                                                 compression=compression, policy=policy,
                                                 model=model, **knobs)
        finish = getattr(opt, "flush", lambda: None)
        out.append(Candidate(label, _stepper(name, model, opt, batch_size, rank), finish,
                             optimizer=opt, predicted=predicted, model=model))
    return out


# At most this many steps beyond --warmup while `auto` is still measuring (its choice's and its
# re-plan's checks take 20 steps each; the trials of two runners-up, two synchronous baselines,
# a knob setting's twin and the choice 6 x 6 x 10; each window one untimed step more; the kept
# plan's refinement 10: 448 in all): a cap, so that a bug cannot make a benchmark run forever.
MAX_SETTLING_STEPS = 480


def settling(optimizer: Any) -> bool:
    """Whether a commsched `optimizer` has yet to settle on the plan that stays: timed rounds
    must measure that plan, not the profiling plan, the plan made before the steady state's
    re-plan (Note [Planning from the steady state]) or `auto`'s trials (Note [Measuring the
    close calls])."""
    return getattr(optimizer, "plan_settled", True) is False


def step_until_settled(optimizer: Any, step: Callable[[int], None], first: int) -> int:
    """Steps on, untimed, from step index `first` while `optimizer` is settling (at most
    MAX_SETTLING_STEPS); returns the index of the next step."""
    index = first
    while index < first + MAX_SETTLING_STEPS and settling(optimizer):
        step(index)
        index += 1
    return index


def run(candidates: list[Candidate], warmup: int, rounds: int, steps: int) -> float:
    """Steady-state step times. Each round ends with the candidate's pending work flushed (so
    the next candidate runs on a quiet network) and starts with one untimed step: that step has
    nothing in flight from before, so it pays for no earlier iteration's traffic. Every timed step
    then pays for exactly one earlier iteration, as in a long training run. Only end times are
    recorded here; `iteration_times` turns them into step times. Returns how busy the machine's
    cores were during the timed rounds (CpuMeter)."""
    counter = warmup
    for cand in candidates:
        for i in range(warmup):
            cand.step(i)
        counter = max(counter, step_until_settled(cand.optimizer, cand.step, warmup))
        cand.finish()
    meter = CpuMeter()
    for round_index in range(rounds):
        # A new order every round, the same on every rank (their collectives must pair up): a
        # slow phase of the machine must not fall on the same candidates round after round, nor
        # one candidate always run after another's traffic.
        for cand in random.Random(round_index).sample(candidates, len(candidates)):
            cand.step(counter)
            ends = [time.perf_counter()]
            counter += 1
            cand.cpu.start()
            for _ in range(steps):
                cand.step(counter)
                ends.append(time.perf_counter())
                counter += 1
            cand.cpu.stop()
            cand.ends.append(ends)
            cand.finish()
    return meter.busy()


def iteration_times(per_rank_ends: list[list[list[float]]]) -> list[float]:
    """Time between consecutive completions of a step by the slowest rank.

    Ranks run on one host here, so perf_counter (CLOCK_MONOTONIC) is one clock for all of them.
    Taking the slowest rank's own duration of each step instead would overstate overlap
    policies: their `step()` returns early and each rank waits in a different step's forward
    pass, so per-step maxima add up waits that happened on different steps.
    """
    times: list[float] = []
    for rounds in zip(*per_rank_ends, strict=True):
        slowest = [max(ends) for ends in zip(*rounds, strict=True)]
        times.extend(b - a for a, b in zip(slowest, slowest[1:], strict=False))
    return times


def minimal_communication_ms(model: nn.Module, repeats: int = 5) -> float:
    """One all-reduce of every gradient byte at once: no schedule can communicate less."""
    if commsched.size() == 1:
        return 0.0
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = torch.zeros(numel)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        times.append(time.perf_counter() - start)
    slowest = [max(ts) for ts in zip(*commsched.init().all_gather_object(times), strict=True)]
    return 1e3 * statistics.median(slowest)


def add_bound(rows: list[dict], comm_floor_ms: float) -> dict:
    """Lower bound of an iteration with cross-iteration overlap: max(compute, minimal comm)."""
    by_name = {r["name"]: r["median_ms"] for r in rows}
    compute = by_name.get(LOCAL)
    bound = max(compute, comm_floor_ms) if compute is not None else None
    for row in rows:
        row["vs_bound"] = row["median_ms"] / bound if bound else None
    hvd = by_name.get("hvd")
    waiting = (hvd - compute) / hvd if hvd and compute is not None else None
    return {"compute_ms": compute, "min_comm_ms": comm_floor_ms, "bound_ms": bound,
            "hvd_waiting_fraction": waiting}


def timing_rows(candidates: list[Candidate]) -> list[dict[str, Any]]:
    """Per candidate: median, p10 and p90 of the slowest rank's iteration times (collective)."""
    world = commsched.init()
    rows: list[dict[str, Any]] = []
    for cand in candidates:
        per_rank = world.all_gather_object(cand.ends)
        # iteration_times pairs steps within a round only: the run's are the rounds' together.
        by_round = [iteration_times([[ends[r]] for ends in per_rank])
                    for r in range(len(cand.ends))]
        slowest = [t for times in by_round for t in times]
        # Every rank read the same machine's cores over nearly the same stretches.
        busy = [b for b in world.all_gather_object(cand.cpu.fraction()) if b is not None]
        rows.append({"name": cand.name, "median_ms": 1e3 * statistics.median(slowest),
                     "cpu_busy": statistics.median(busy) if busy else None,
                     "p10_ms": 1e3 * _quantile(slowest, 0.1),
                     "p90_ms": 1e3 * _quantile(slowest, 0.9), "samples": len(slowest),
                     "round_medians_ms": [1e3 * statistics.median(t) for t in by_round if t]})
    return rows


def summarise(candidates: list[Candidate], memory: bool = False) -> list[dict]:
    """Per candidate: the step time is the slowest rank's; report medians and ratios; with
    `memory`, the most optimizer state any rank holds."""
    rows = timing_rows(candidates)
    for row, cand in zip(rows, candidates, strict=True):
        sent = candidate_bytes(cand.name, cand.model, cand.optimizer, commsched.size())
        row.update(sent.as_json() if sent is not None else {})
        if memory:
            held = torch.tensor([float(state_bytes(cand.optimizer))])
            if dist.is_initialized():
                dist.all_reduce(held, op=dist.ReduceOp.MAX)
            row["state_bytes"] = int(held.item())
    by_name = {r["name"]: r["median_ms"] for r in rows}
    for row in rows:
        for base in ("hvd", "torch-ddp"):
            row[f"vs_{base}"] = row["median_ms"] / by_name[base] if base in by_name else None
    return rows


# Note [What ships measures; the repository predicts]
# `compare` times candidates side by side: a user measures their own model with it. Setting
# each measured run beside the simulator's prediction (--predict), `auto`'s verdict, the floor
# and the planner pairs is the repository's report machinery (benchmarks/harness/
# compare_predict.py), not shipped: it hands `main` a RunAnalysis of its own. The shipped one
# only times, and names where the prediction lives when asked for it.
class RunAnalysis:
    """What a comparison does beyond timing its candidates: here nothing (the base and the
    shipped default). A variant adds its arguments, keeps the commsched candidates' profiles
    and analyses the timed run on every rank."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Adds the variant's command-line arguments to compare's `parser`."""
        # Known, so that asking for them is refused by name (refusal), not as a typo.
        parser.add_argument("--predict", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--predict-dir", default="", help=argparse.SUPPRESS)

    def refusal(self, args: argparse.Namespace) -> str | None:
        """Why these arguments cannot run (None: they can), before any training."""
        if args.predict or args.predict_dir:
            return ("--predict and --predict-dir simulate each candidate with the report "
                    "machinery of commsched's repository, not installed with the package: from "
                    "a checkout, run `python -m benchmarks.harness.compare_predict` with the "
                    "same arguments")
        return None

    def directories(self, args: argparse.Namespace) -> list[tuple[str, str]]:
        """(path, option) of each output directory the variant writes, checked before any
        training."""
        return []

    def keeps_profiles(self, args: argparse.Namespace) -> tuple[bool, str]:
        """(whether the commsched candidates are analysed from their profiles, the directory
        their profiles are kept in or '')."""
        return False, ""

    def analyse(self, candidates: list[Candidate], wanted: list[str], rows: list[dict],
                bound: dict, args: argparse.Namespace) -> str:
        """Called on every rank after the timed rounds (it may gather); adds to `rows` and
        `bound` on rank 0 and returns the lines results.md prints below the bound."""
        return ""


def typed_command(module: str, argv: list[str] | None) -> str:
    """A benchmark's command line as a user types it from the repository root (no path of
    this machine), for the reports."""
    return f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else argv)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None, analysis: RunAnalysis | None = None,
         module: str = "commsched.bench.compare") -> int:
    """Runs the comparison from the command line `argv` (sys.argv's by default).

    Args:
        argv: the arguments, without the program's name.
        analysis: what the run does beyond timing (Note [What ships measures; the repository
            predicts]); the shipped RunAnalysis only times.
        module: the module the user ran, for the command the reports print.

    Returns:
        The exit status: 0, or 2 for arguments that cannot run.
    """
    analysis = analysis or RunAnalysis()
    keep_layout = argparse.RawDescriptionHelpFormatter  # the docstring's example keeps its lines
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=keep_layout)
    parser.add_argument("--model", type=model_argument, default="cnn",
                        help="a built-in model, or a real architecture at full size with reduced "
                        f"inputs ({', '.join(m.value for m in MODEL_CHOICES)}), or your own: "
                        "hf:<transformers model type>?key=value&... (hf:t5?num_layers=4), "
                        "tv:<torchvision model>?key=value&... (tv:resnet18), or a device's "
                        "compute replayed: profile:<profile JSON>?k=<byte scale>")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--candidates", default=f"{LOCAL},hvd,torch-ddp,commsched:horovod,"
                        "commsched:ddp,commsched:mgwfbp,commsched:bytescheduler,commsched:prophet,"
                        "commsched:dear?fusion_threshold=4MiB",
                        help="comma-separated; commsched:POLICY?knob=value&knob=value sets knobs")
    parser.add_argument("--warmup", type=int, default=8, help="steps per candidate before timing "
                        "(covers commsched's profiling steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per candidate per round")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                        help="every candidate's optimizer (SGD: momentum 0.9)")
    parser.add_argument("--memory", action="store_true", help="report the optimizer state the "
                        "fullest rank holds per candidate (shard_optimizer, torch-zero)")
    parser.add_argument("--link-note", default="", help="what the network was, for the report")
    parser.add_argument("--out", default="", help="directory for results.json/.md/.png")
    analysis.add_arguments(parser)
    args = parser.parse_args(argv)
    refusal = analysis.refusal(args)
    if refusal is not None:
        print(f"compare: {refusal}", file=sys.stderr)
        return 2
    try:  # before any training: a bad path is one line now, not a traceback after the run
        for path, what in ((args.out, "--out"), *analysis.directories(args)):
            if path:
                prepare_dir(path, what)
    except OutputPathError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    world = commsched.init()
    if world.size > 1 and not dist.is_initialized():
        raise SystemExit("compare needs torch.distributed for the DDP baseline")
    wanted = [c.strip() for c in args.candidates.split(",") if c.strip()]
    predict, profile_dir = analysis.keeps_profiles(args)
    candidates = make_candidates(args.model, wanted, args.batch_size, predict, profile_dir,
                                 args.optimizer)
    cpu_busy = run(candidates, args.warmup, args.rounds, args.steps)
    rows = summarise(candidates, args.memory)
    bound = add_bound(rows, minimal_communication_ms(build(args.model)))
    notes = analysis.analyse(candidates, wanted, rows, bound, args)
    if world.rank == 0:
        command = typed_command(module, argv)
        print(f"\n{args.model.value}, {world.size} ranks, batch {args.batch_size} per rank, "
              f"{rows[0]['samples']} timed steps per candidate\n")
        print(markdown_table(rows))
        pace = " (the CPU set the pace)" if cpu_busy >= CPU_BOUND else ""
        print("\n" + bound_lines(bound) + notes, flush=True)
        print(f"cores busy during the timed rounds: {cpu_busy:.0%}{pace}", flush=True)
        if args.out:
            meta = {"model": args.model.value, "world_size": world.size, "command": command,
                    "network": args.link_note, "commit": source_commit(),
                    "cpu_busy_timed": cpu_busy,
                    "args": vars(args) | {"model": args.model.value}}
            write_outputs(args.out, rows, meta, bound, notes)
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
