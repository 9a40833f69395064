"""What commsched itself costs per iteration: a world of one (no communication at all), every
policy and `auto` beside the plain optimizer, on the built-in models (and GPT-2 124M where
`transformers` is importable and a GPU is used). Rounds are interleaved so that machine noise
hits every candidate alike; each candidate's figure is its best per-round median, and the ratio
is that over the plain optimizer's. A second plain optimizer (the control) shows the noise.
On a GPU, `--free-running` times each round a second way (Note [Two clocks on a GPU]).

    python -m benchmarks.harness.overhead --device cpu --out benchmarks/overhead/cpu
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import commsched
from commsched.bench.compare import MAX_SETTLING_STEPS, step_until_settled, typed_command
from commsched.bench.models import optimizer_class
from commsched.bench.profile_model import PROFILE_PREFIX
from commsched.outputs import OutputPathError, prepare_dir

from .allocator import keep_freed_memory, page_faults
from .overhead_report import (
    CANDIDATES,
    CONTROL,
    GPT2,
    KEPT,
    PLAIN,
    markdown,
    render,
    targets,
    write_report,
)
from .overhead_workloads import MODELS, Workload, workload


@dataclass
class Candidate:
    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    # Every timed step's seconds, per round (results.json keeps them, so that a run on a lent
    # machine can be read again with other statistics without running it again).
    steps_s: list[list[float]] = field(default_factory=list)
    free_steps_s: list[list[float]] = field(default_factory=list)  # --free-running
    faults: list[float] = field(default_factory=list)  # minor page faults per step, per round

    @property
    def medians(self) -> list[float]:
        """Seconds, one per round."""
        return [statistics.median(steps) for steps in self.steps_s]

    @property
    def free_medians(self) -> list[float]:
        return [statistics.median(steps) for steps in self.free_steps_s]


def _optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    # A replayed profile's optimizer also sleeps the device's update (models.optimizer_class).
    if kind == "sgd":
        sgd: Any = optimizer_class(model, torch.optim.SGD)  # takes SGD's arguments
        return sgd(model.parameters(), lr=0.01, momentum=0.9)
    adamw: Any = optimizer_class(model, torch.optim.AdamW)
    return adamw(model.parameters(), lr=1e-4)


def make_candidates(work: Workload, optimizer: str, policies: list[str],
                    rotation: int = 0) -> list[Candidate]:
    """The plain optimizer, its control and one wrapper per policy, in that order; built
    starting `rotation` places further along it (Note [Builds of the candidates])."""
    labels = [PLAIN, CONTROL, *policies]
    start = rotation % len(labels)
    built = {}
    for label in labels[start:] + labels[:start]:
        model = work.make_model()
        opt = _optimizer(model, optimizer)
        if label not in (PLAIN, CONTROL):
            opt = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                 model=model, policy=label.removesuffix(KEPT))
            if label.endswith(KEPT):  # Note [The engine kept] in overhead_report.py
                opt.session.never_pass_through()
        built[label] = Candidate(label, model, opt)
    return [built[label] for label in labels]


def _step(cand: Candidate, work: Workload, step: int, autocast: bool,
          batch: tuple[Any, Any] | None = None) -> None:
    x, y = batch if batch is not None else work.make_batch(step)
    cand.optimizer.zero_grad()
    device_type = "cuda" if torch.cuda.is_available() and autocast else "cpu"
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        out = cand.model(x)
        loss = work.loss(out, y)
    loss.backward()
    cand.optimizer.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_per_round(plain: Candidate, work: Workload, device: torch.device, autocast: bool,
                    round_s: float, least: int) -> int:
    """Enough steps for a round to last about `round_s` on the plain optimizer, and at least
    `least`: a median of ten 0.7 ms steps (the MLP) moves by several percent between rounds of
    two identical candidates, which would hide a 10% target."""
    for i in range(3):  # the first steps allocate the optimizer's state
        _step(plain, work, i, autocast)
    _sync(device)
    started = time.perf_counter()
    for i in range(least):
        _step(plain, work, i, autocast)
    _sync(device)
    per_step = (time.perf_counter() - started) / least
    return max(least, int(round_s / max(per_step, 1e-9)))


# Note [Two clocks on a GPU]
# The default clock synchronises the device after every step, so a step's time is wall time
# and its median is robust. It also drains the device's queue every step, as a loop that reads
# `loss.item()` each step does: the next forward pass then starts on an idle device, and an
# update deferred into that forward pass (the overlap policies) runs where the device would
# have waited for the host. Plain and synchronous optimizers cannot hide their update there;
# on GPT-2 124M the overlap policies measured 3-4% below the plain optimizer this way in the
# first runs (H100 and H200), but not in every later one (Note [A target within the noise] in
# overhead_report.py).
# A loop that reads its loss only now and then keeps the queue full instead. The
# free-running clock times that loop: no synchronisation inside a round, a CUDA event recorded
# after each step, and a step's time is the device time between two events (which includes
# the device waiting for the host, so a host-bound step still shows its host cost). Its batches
# are on the device before the first event: a batch's copy from pageable host memory waits
# for the stream to empty (torch's blocking copy synchronises), which would drain the queue
# every step again. A user's loop keeps its queue full the same way: a DataLoader with
# pin_memory=True and .to(device, non_blocking=True).
def _free_running_times(cand: Candidate, work: Workload, device: torch.device, first: int,
                        steps: int, autocast: bool) -> list[float]:
    """Seconds per step of `steps` steps run without a synchronisation between them (on a
    CPU nothing runs ahead of the host, and this is the per-step clock without the batches'
    making)."""
    batches = [work.make_batch(first + i) for i in range(steps)]
    _sync(device)
    marks = [_mark(device)]
    for i, batch_of_step in enumerate(batches):
        _step(cand, work, first + i, autocast, batch_of_step)
        marks.append(_mark(device))
    _sync(device)
    return [_seconds_between(a, b) for a, b in zip(marks, marks[1:], strict=False)]


def _mark(device: torch.device) -> Any:
    """A point on the free-running clock: a CUDA event on the current stream, or the host's
    time where no device runs ahead of it."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _seconds_between(start: Any, end: Any) -> float:
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def run(candidates: list[Candidate], work: Workload, device: torch.device, warmup: int,
        rounds: int, steps: int, autocast: bool, free_running: bool = False,
        seed: int = 0) -> None:
    """Each round runs every candidate, in a shuffled order, for `steps` timed steps after one
    untimed one; a step's time is from the end of the previous step to the end of this one, so
    an update deferred to the next forward pass (overlap policies) is counted in the step that
    runs it. With `free_running`, `steps` more steps follow on the other clock (Note [Two
    clocks on a GPU]) before the round's deferred update is flushed. `seed` picks the orders
    (each build of the candidates its own)."""
    for cand in candidates:
        for i in range(warmup):  # profiling steps, the re-plan, auto's 20-step check
            _step(cand, work, i, autocast)
        step_until_settled(cand.optimizer, functools.partial(_step, cand, work, autocast=autocast),
                           warmup)
        getattr(cand.optimizer, "flush", lambda: None)()
    counter = warmup + MAX_SETTLING_STEPS
    order = random.Random(seed)
    for _ in range(rounds):
        # A new order each round: a slow phase of the machine must not fall on the same
        # candidates round after round.
        for cand in order.sample(candidates, len(candidates)):
            _step(cand, work, counter, autocast)
            _sync(device)
            faults = page_faults()
            ends = [time.perf_counter()]
            for _ in range(steps):
                counter += 1
                _step(cand, work, counter, autocast)
                _sync(device)
                ends.append(time.perf_counter())
            cand.faults.append((page_faults() - faults) / steps)
            cand.steps_s.append([b - a for a, b in zip(ends, ends[1:], strict=False)])
            if free_running:
                cand.free_steps_s.append(_free_running_times(cand, work, device, counter + 1,
                                                             steps, autocast))
                counter += steps
            getattr(cand.optimizer, "flush", lambda: None)()


def _milliseconds(rounds: list[list[float]]) -> list[list[float]]:
    return [[round(1e3 * step, 4) for step in steps] for steps in rounds]


def rows_of(candidates: list[Candidate]) -> list[dict[str, Any]]:
    plain = min(candidates[0].medians)
    free_plain = min(candidates[0].free_medians) if candidates[0].free_steps_s else None
    rows = []
    for cand in candidates:
        medians, free_medians = cand.medians, cand.free_medians
        best = min(medians)
        opt = cand.optimizer
        plan = getattr(opt, "plan", None)
        auto = getattr(opt, "auto", None)
        row = {"candidate": cand.name, "best_median_ms": 1e3 * best,
               "round_medians_ms": [1e3 * m for m in medians],
               "round_steps_ms": _milliseconds(cand.steps_s),
               "vs_plain": best / plain,
               "page_faults_per_step": statistics.median(cand.faults),
               "plan": plan.policy if plan is not None else None,
               "update_groups": len(plan.update_groups) if plan is not None else None,
               "auto_chose": auto.summary()["policy"] if auto is not None else None}
        if free_plain is not None:
            free_best = min(free_medians)
            row["free_best_median_ms"] = 1e3 * free_best
            row["free_round_medians_ms"] = [1e3 * m for m in free_medians]
            row["free_round_steps_ms"] = _milliseconds(cand.free_steps_s)
            row["free_vs_plain"] = free_best / free_plain
        rows.append(row)
    return rows


# A candidate's timed steps per round on each clock, and its page faults per round.
Timings = tuple[list[list[float]], list[list[float]], list[float]]


# Note [Builds of the candidates]
# Two plain optimizers, each on its own copy of one model, measured side by side for a whole
# run, settled apart by 1.5-3% on a lent H100 (and by up to 1.8% here): each copy's memory
# placement is an offset that lasts as long as the copy, and resampling rounds cannot see it
# (Note [A target within the noise] in overhead_report.py). `--instances N` builds every
# candidate N times, one set after another, and runs `--rounds` rounds on each build: a
# candidate's figure is then its best round over N copies of its model, the best of N
# placements rather than whichever one it was given. Each build is made in another order
# (rotated by one candidate) after the last one's memory is returned, so that a caching
# allocator does not hand each candidate the blocks it had before, and runs its own sequence
# of round orders. The steps per round are set once, on the first build. Here, on the CNN
# beside horovod and dear, seven pairs of runs (`--models cnn --policies horovod,dear`,
# `--instances 1 --rounds 24` against `--instances 4 --rounds 6`, on the code before the
# rotation) put the control closer to 1.000 with four builds than with one, on average and at
# worst (measured in benchmarks/overhead/builds_cpu/README.md): a small gain, not a settled one.
# The gain is larger where the figure is a minimum over candidates: past warm-up every policy
# in a world of one runs the same code, so "the fastest policy" is the luckiest of its copies,
# and with one build `auto` read 1.030x (CNN) and 1.033x (Transformer) that luckiest copy, with
# four 1.000x and 1.003x (CNN; benchmarks/overhead/cnn_builds_cpu/). scripts/bench_overhead.sh
# therefore runs four builds of 10 rounds; this module's default stays one build, for a quick
# look.
def measure_builds(work: Workload, device: torch.device, args: argparse.Namespace,
                   autocast: bool, built: Callable[[int, list[dict[str, Any]], int], None]
                   = lambda steps, rows, builds: None) -> tuple[int, list[dict[str, Any]]]:
    """Steps per round, and the rows of every candidate over `args.instances` builds;
    `built(steps, rows, builds)` hears of the rows so far after each build but the last (a
    run cut short by a time limit then keeps the builds it finished)."""
    # The earlier builds' timings, per candidate: their models are gone before the next build
    # (on a GPU two builds of nine GPT-2 candidates and their optimizer states would not fit).
    earlier: list[Timings] = []
    plans: list[list[str | None]] = []  # per build, each candidate's plan (auto: its choice)
    steps = 0
    for index in range(args.instances):
        candidates, steps = _build_and_run(work, device, args, autocast, steps, earlier, index)
        rows = rows_of(candidates)
        plans.append([row["auto_chose"] or row["plan"] for row in rows])
        _close(candidates)
        if index == args.instances - 1:
            break
        built(steps, rows, index + 1)
        earlier = [(c.steps_s, c.free_steps_s, c.faults) for c in candidates]
        del candidates
        gc.collect()  # torch.optim's reference cycles: the models go now, not at some later GC
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.instances > 1:  # the plan columns are the last build's
        for position, row in enumerate(rows):
            row["plan_per_build"] = [build_plans[position] for build_plans in plans]
    return steps, rows


def _build_and_run(work: Workload, device: torch.device, args: argparse.Namespace,
                   autocast: bool, steps: int, earlier: list[Timings], index: int
                   ) -> tuple[list[Candidate], int]:
    """Build `index` of the candidates, run for `args.rounds` rounds after the rounds of the
    builds before it (`steps`: per round; 0 on the first build, which sets it)."""
    candidates = make_candidates(work, args.optimizer,
                                 [p for p in args.policies.split(",") if p], rotation=index)
    if not steps:
        steps = steps_per_round(candidates[0], work, device, autocast, args.round_ms / 1e3,
                                args.steps)
    run(candidates, work, device, args.warmup, args.rounds, steps, autocast,
        free_running=args.free_running, seed=index)
    if earlier:
        for (steps_s, free_steps_s, faults), cand in zip(earlier, candidates, strict=True):
            cand.steps_s[:0] = steps_s
            cand.free_steps_s[:0] = free_steps_s
            cand.faults[:0] = faults
    return candidates, steps


def _close(candidates: list[Candidate]) -> None:
    for cand in candidates:
        session = getattr(cand.optimizer, "session", None)
        if session is not None:
            session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", default="",
                        help="comma-separated (default: mlp,cnn,transformer; on cuda gpt2 "
                             "first); gpt2_layout: GPT-2's tensors at width 32 (host-bound); "
                             "profile:PATH?k=...: a device's compute replayed")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    parser.add_argument("--policies", default=",".join(CANDIDATES),
                        help=f"comma-separated; a policy followed by '{KEPT}' never steps as "
                             "the plain optimizer (Note [The engine kept] in overhead_report.py)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="per step (default: 16, the Transformer 8)")
    parser.add_argument("--warmup", type=int, default=30)
    # Many short rounds: this kind of machine has slow phases lasting seconds, and each
    # candidate's best round must come from a quiet one.
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round, at least")
    parser.add_argument("--round-ms", type=float, default=60.0,
                        help="more steps per round where the plain optimizer's take less time")
    parser.add_argument("--instances", type=int, default=1,
                        help="build every candidate this many times and run --rounds rounds on "
                             "each build (Note [Builds of the candidates])")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--free-running", action="store_true",
                        help="also time each round without a synchronisation per step (CUDA "
                             "events; on a CPU the same as the default clock)")
    parser.add_argument("--out", default="", help="directory for results.json/.md/.png")
    parser.add_argument("--render", default="", metavar="DIR",
                        help="measure nothing: check the targets of DIR/results.json again, "
                             "rewrite them there and write its README.md and plot (a report of "
                             "an earlier run, or of another machine's, read by this code)")
    args = parser.parse_args(argv)
    if args.instances < 1:
        parser.error(f"--instances {args.instances}: at least one build of the candidates")
    if args.render:
        if args.out or args.instances != 1:
            parser.error("--render DIR measures nothing and writes its report into DIR: "
                         "--out and --instances have no place beside it")
        return render(args.render)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("overhead: --device cuda, but torch.cuda.is_available() is false here (torch "
              f"{torch.__version__}): no GPU part to run", file=sys.stderr)
        return 2
    if args.out:
        try:  # before any run: a bad path is one line now, not a traceback after the run
            prepare_dir(args.out, "--out")
        except OutputPathError as err:
            print(f"overhead: {err}", file=sys.stderr)
            return 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # On a GPU, GPT-2 first: it is the model item 3 sets targets for there, and a lent
    # machine's minutes may run out before the built-in models are done.
    default = ([GPT2] if args.device == "cuda" else []) + ["mlp", "cnn", "transformer"]
    models = [m.strip() for m in args.models.split(",") if m.strip()] or default
    if {m for m in models if not m.startswith(PROFILE_PREFIX)} - set(MODELS):
        parser.error(f"--models {args.models}: choose from {', '.join(MODELS)}, or a replayed "
                     f"profile ({PROFILE_PREFIX}PATH?k=...)")
    command = typed_command("benchmarks.harness.overhead", argv)
    # Before any tensor: see Note [Page faults are the heap's, not the candidate's].
    allocator = keep_freed_memory() or "the C library's malloc as it came (no mallopt)"
    meta = {"device": args.device, "command": os.environ.get("OVERHEAD_COMMAND", command),
            "torch": torch.__version__ + (f", {torch.cuda.get_device_name(device)}"
                                          if device.type == "cuda" else ""),
            "optimizer": args.optimizer, "rounds": args.rounds, "instances": args.instances,
            "steps": args.steps, "round_ms": args.round_ms, "warmup": args.warmup,
            "threads": args.threads, "allocator": allocator,
            "args": vars(args)}
    commsched.init()
    results: list[dict[str, Any]] = []
    for name in models:
        work = workload(name, device, args.batch_size)
        if work is None:
            print("overhead: transformers is not importable; GPT-2 skipped", file=sys.stderr)
            continue
        autocast = name == GPT2 and device.type == "cuda"
        def result(steps: int, rows: list[dict[str, Any]], builds: int,
                   name: str = name) -> dict[str, Any]:
            return {"model": name, "steps": steps, "rows": rows, "builds": builds,
                    "targets": targets(name, args.device, rows, builds)}

        def built(steps: int, rows: list[dict[str, Any]], builds: int) -> None:
            if args.out:
                write_report(args.out, results + [result(steps, rows, builds)], meta)

        results.append(result(*measure_builds(work, device, args, autocast, built),
                              args.instances))
        print(markdown(results[-1:], meta), flush=True)
        if args.out:  # after each model: a run cut short by a time limit keeps what it measured
            write_report(args.out, results, meta)
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
