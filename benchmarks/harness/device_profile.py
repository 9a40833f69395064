"""One real model's profile on one device, for the simulator (issue 55, item 4).

A world of one steps the model at the inputs it trains on (`real_models.Inputs.FULL`) under
commsched's `dear`, whose profile records the forward modules that the simulator's deadlines
need, and keeps the end-of-run profile. Beside it, the plain optimizer's step is timed on the
same device: the profile's compute against that step is the validation row. Then
`python -m commsched simulate --profile DIR/profile.json` predicts any number of workers on any
link from the device's own compute (scripts/device_scale.sh does both on a lent GPU).

    python -m benchmarks.harness.device_profile --model resnet50 --device cuda --out DIR

Writes DIR/profile.json (the profile) and DIR/recording.json (what was run, and the validation).

Note [Device time on the host's clock]
The profile's compute figures (before_first_ready_s, the modules' forward times, step_s) are
stretches of the training thread on the host's clock (Note [Which clock] in
runtime/engine/profiler.py). On a GPU the host only enqueues kernels, so those stretches would time
the
launches, not the work. The recording therefore runs with CUDA_LAUNCH_BLOCKING=1: each launch
returns once its kernel is done, and the host's clock times the device's work plus one launch
latency per kernel. The variable is read when CUDA starts (even `torch.cuda.is_available()`
may start it), so the recording runs in a child process started with it, and the plain
optimizer's free-running step, which it would slow down, in another child without it; the
parent only reads what they wrote. Their difference is the validation row's error: what
blocking added, and what the profile misses.

Note [A CPU step's share of its core]
On a CPU device each child also records the fraction of its stepping time that its process was
on a core (CPU time over wall time). The two children run one after the other, so a machine
busy with other work may slow one and not the other: a wall-clock step times that work too.
Each wall time times its share is the step's own CPU time, which compares the two children
whatever else ran beside them (the test suite's second worker, say). On a GPU the host waits
for the device, so the share means nothing there and is not used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

import commsched
from commsched.bench.real_models import Inputs, RealModel, batch, build, loss_fn
from commsched.outputs import OutputPathError, prepare_dir
from commsched.sim.floor import profile_compute_s
from commsched.sim.profile import profile_from_document

BLOCKING = "CUDA_LAUNCH_BLOCKING"
MODULE = "benchmarks.harness.device_profile"  # __name__ is "__main__" under -m
# Per-device batches of common data-parallel recipes at Inputs.FULL.
FULL_BATCH = {RealModel.RESNET50: 64, RealModel.VGG16: 64, RealModel.BERT: 32,
              RealModel.GPT2: 8}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stepper(name: RealModel, model: torch.nn.Module, opt: torch.optim.Optimizer,
             data: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], None]:
    """One training step on one batch, kept on the device (the synthetic benchmarks' way: no
    input copy in the step)."""
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(name, model(data[0]), data[1]).backward()
        opt.step()
    return step


def _setup(name: RealModel, device: torch.device, batch_size: int,
           inputs: Inputs) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                    tuple[torch.Tensor, torch.Tensor]]:
    model = build(name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = batch(name, batch_size, 0, 0, inputs)
    return model, opt, (x.to(device), y.to(device))


class SteppingTime(NamedTuple):
    """How long a child's steps took, and how much of that its process was on a core."""

    median_ms: float  # the median step, wall clock
    cpu_share: float  # CPU time over wall time across the steps: the module Note on a share


def plain_step_ms(name: RealModel, device: torch.device, batch_size: int, inputs: Inputs,
                  warmup: int, steps: int) -> SteppingTime:
    """The plain optimizer's median step, the device synchronised after each.

    Args:
        name: the model.
        device: where it runs.
        batch_size: samples per step.
        inputs: their size.
        warmup: untimed steps first.
        steps: timed steps.

    Returns:
        The median step in milliseconds, and the share of the timed steps spent on a core.
    """
    model, opt, data = _setup(name, device, batch_size, inputs)
    step = _stepper(name, model, opt, data)
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    cpu_start = time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return SteppingTime(1e3 * statistics.median(times),
                        (time.process_time() - cpu_start) / sum(times))


def record_profile(name: RealModel, device: torch.device, batch_size: int, inputs: Inputs,
                   steps: int) -> tuple[dict, float]:
    """`dear`'s end-of-run profile after `steps` steps in a world of one.

    Args:
        name: the model.
        device: where it runs.
        batch_size: samples per step.
        inputs: their size.
        steps: steps in all (the profiling steps among them).

    Returns:
        The profile document (`python -m commsched simulate --profile` reads it), and the
        share of the steps' time that the process was on a core.
    """
    model, opt, data = _setup(name, device, batch_size, inputs)
    wrapped = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                             model=model, policy="dear")
    step = _stepper(name, model, wrapped, data)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
        _sync(device)
    cpu_share = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    wrapped.flush()
    document: dict = wrapped.session.profile_document()
    wrapped.session.close()
    return document, cpu_share


def _child(args: argparse.Namespace, role: str, blocking: bool) -> str:
    """Runs this module again as `role` (--plain-only or --record-only) with
    CUDA_LAUNCH_BLOCKING=1 when `blocking`, and without it otherwise: a process that has
    started CUDA cannot change it (Note [Device time on the host's clock]). Returns its stdout.
    """
    env = {k: v for k, v in os.environ.items() if k != BLOCKING}
    if blocking:
        env[BLOCKING] = "1"
    command = [sys.executable, "-m", MODULE, "--model", args.model.value, "--device",
               args.device, "--batch-size", str(args.batch_size), "--inputs", args.inputs.value,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--timed",
               str(args.timed), "--out", args.out, role]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"device_profile: {role} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def _last_json(stdout: str) -> dict:
    """The JSON object a child printed last (a library may print before it)."""
    document: dict = json.loads(stdout.strip().splitlines()[-1])
    return document


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=RealModel, choices=list(RealModel), required=True)
    parser.add_argument("--device", default="", help="cuda where torch sees a GPU, else cpu")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="samples per step (default: FULL_BATCH at full inputs, else 2)")
    parser.add_argument("--inputs", type=Inputs, choices=list(Inputs), default=Inputs.FULL)
    parser.add_argument("--steps", type=int, default=20, help="steps of the recording")
    parser.add_argument("--warmup", type=int, default=5, help="untimed plain steps")
    parser.add_argument("--timed", type=int, default=20, help="timed plain steps")
    parser.add_argument("--out", default="", help="directory for profile.json and "
                        "recording.json")
    role = parser.add_mutually_exclusive_group()  # the children of the Note
    role.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)
    role.add_argument("--record-only", action="store_true", help=argparse.SUPPRESS)
    return parser


def _as_child(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if args.plain_only:
        timing = plain_step_ms(args.model, device, args.batch_size, args.inputs, args.warmup,
                               args.timed)
        print(json.dumps({"plain_ms": timing.median_ms, "cpu_share": timing.cpu_share}))
        return
    commsched.init()
    document, cpu_share = record_profile(args.model, device, args.batch_size, args.inputs,
                                         args.steps)
    commsched.shutdown()
    with open(os.path.join(args.out, "profile.json"), "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" \
        else platform.processor() or "CPU"
    print(json.dumps({"device_name": name, "cpu_share": cpu_share}))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.batch_size:
        args.batch_size = FULL_BATCH[args.model] if args.inputs is Inputs.FULL else 2
    if args.plain_only or args.record_only:
        _as_child(args)
        return 0
    try:
        if not args.out:
            raise OutputPathError("--out is required")
        prepare_dir(args.out, "--out")
    except OutputPathError as err:
        print(f"device_profile: {err}", file=sys.stderr)
        return 2
    # This process only reads what its children measured (asking whether there is a GPU may
    # start CUDA here, which is why they are children).
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    blocking = torch.device(args.device).type == "cuda"
    plain = _last_json(_child(args, "--plain-only", False))
    plain_ms = float(plain["plain_ms"])
    recorded = _last_json(_child(args, "--record-only", blocking))
    device_name = str(recorded["device_name"])
    with open(os.path.join(args.out, "profile.json"), encoding="utf-8") as handle:
        compute_ms = 1e3 * profile_compute_s(profile_from_document(json.load(handle)))
    recording = {
        "model": args.model.value, "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__, "batch_size": args.batch_size, "inputs": args.inputs.value,
        "steps": args.steps, "launch_blocking": blocking, "plain_ms": plain_ms,
        "profile_compute_ms": compute_ms, "error": abs(compute_ms - plain_ms) / plain_ms,
        # The step as CPU time: see Note [A CPU step's share of its core].
        "plain_cpu_share": float(plain["cpu_share"]),
        "recording_cpu_share": float(recorded["cpu_share"]),
        "command": f"python -m {MODULE} " + " ".join(argv or sys.argv[1:])}
    with open(os.path.join(args.out, "recording.json"), "w", encoding="utf-8") as handle:
        json.dump(recording, handle, indent=1)
    print(f"device_profile: {args.model.value} on {recording['device_name']}: plain "
          f"step {plain_ms:.1f} ms, the profile's compute {compute_ms:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
