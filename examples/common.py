"""What the examples share: the command line (commsched's knobs included), and a training loop
with mixed precision, checkpoints and resume. Each example adds only its model and its data.

Run any example the same way under either launcher:

    horovodrun -np 2 python examples/pytorch_resnet50.py --policy auto
    torchrun --nproc_per_node=2 examples/pytorch_gpt2.py --amp --checkpoint gpt2.pt
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import commsched

Batch = Any
MakeBatch = Callable[[int, int, torch.device], Batch]  # (step, rank, device) -> batch
ComputeLoss = Callable[[nn.Module, Batch], torch.Tensor]


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes; an example adds its model's own."""
    # The example's docstring whole, its command lines as written.
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps in all (a resumed "
                   "run goes on from its checkpoint's step up to this many)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the "
                   "example's own)")
    p.add_argument("--policy", default=None, help="commsched's scheduling policy: horovod, ddp, "
                   "mgwfbp, bytescheduler, prophet, dear or auto (default: COMMSCHED_POLICY, "
                   "else horovod)")
    p.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                   help="any other commsched knob, as DistributedOptimizer's keyword argument: "
                   "--knob fusion_threshold=4MiB --knob compression=fp16 (README, 'Knobs')")
    p.add_argument("--amp", nargs="?", const="fp16", choices=("fp16", "bf16"), default=None,
                   help="mixed precision: fp16 autocast with a GradScaler (the default of "
                   "--amp), or bf16 autocast, which needs no scaler")
    p.add_argument("--checkpoint", default="", help="file to save to every --checkpoint-every "
                   "steps and at the end; a run that finds it there resumes from it")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's "
                   "default)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--summary", default="", help="each rank writes a JSON summary of its run "
                   "here ({rank} is replaced): losses, a digest of its parameters")
    return p


def knobs(pairs: list[str]) -> dict[str, Any]:
    """`--knob KEY=VALUE` options as DistributedOptimizer's keyword arguments; commsched checks
    the keys and values and names any it refuses."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--knob {pair!r}: expected KEY=VALUE, e.g. fusion_threshold=4MiB")
        out[key.strip().lower()] = value.strip()
    return out


def device() -> torch.device:
    """This rank's GPU where there is one (one GPU per local rank), else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(commsched.local_rank() % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _save(path: str, model: nn.Module, opt: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler, step: int) -> None:
    # Every rank builds the state: under an overlap policy, state_dict() first applies the
    # update still in flight, which takes every rank. Rank 0 writes it, through a temporary
    # file, so that a run killed mid-write leaves the last whole checkpoint.
    state = {"optimizer": opt.state_dict(), "model": model.state_dict(),
             "scaler": scaler.state_dict(), "step": step}
    if commsched.rank() == 0:
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)


def _resume(path: str, model: nn.Module, opt: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler) -> int:
    """The step to start from: 0, or the checkpoint's. Every rank reads the file (a shared file
    system, as `torchrun --max-restarts` and Horovod's examples assume)."""
    if not path or not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])  # with commsched's plan: no profiling again
    scaler.load_state_dict(state["scaler"])
    return int(state["step"])


def _digest(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def train(args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer,
          make_batch: MakeBatch, compute_loss: ComputeLoss, where: torch.device) -> None:
    """Trains `model` for `args.steps` steps with commsched, from a checkpoint if there is one.

    Args:
        args: the options of `parser()`.
        model: the model, already on `where`.
        optimizer: a plain torch optimizer over `model`'s parameters.
        make_batch: this rank's batch of a step.
        compute_loss: the loss of a batch.
        where: the device of `model`.
    """
    rank = commsched.rank()
    settings = knobs(args.knob)
    opt = commsched.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         model=model, policy=args.policy, **settings)
    policy = commsched.load_config({"policy": args.policy, **settings}).policy.value
    scaler = torch.amp.GradScaler(where.type, enabled=args.amp == "fp16")
    start = _resume(args.checkpoint, model, opt, scaler)
    # Every rank starts from rank 0's parameters and optimizer state, as Horovod's examples do.
    commsched.broadcast_parameters(model.state_dict(), root_rank=0)
    commsched.broadcast_optimizer_state(opt, root_rank=0)
    if rank == 0:
        print(f"{commsched.size()} ranks, policy {policy}, "
              f"{'resumed at' if start else 'starting at'} step {start}", flush=True)
    amp_dtype = torch.bfloat16 if args.amp == "bf16" else torch.float16
    losses: dict[int, float] = {}
    started = time.perf_counter()
    for step in range(start, args.steps):
        batch = make_batch(step, rank, where)
        opt.zero_grad()
        with torch.autocast(where.type, dtype=amp_dtype, enabled=args.amp is not None):
            loss = compute_loss(model, batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses[step] = float(loss.detach())
        if rank == 0 and (step + 1) % args.log_every == 0:
            per_step = (time.perf_counter() - started) / (step + 1 - start)
            print(f"step {step + 1}: loss {losses[step]:.4f}, {1e3 * per_step:.0f} ms per step",
                  flush=True)
        if args.checkpoint and ((step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps):
            _save(args.checkpoint, model, opt, scaler, step + 1)
    opt.flush()  # an overlap policy's last update lands now, not in a forward pass never run
    if args.summary:
        with open(args.summary.replace("{rank}", str(rank)), "w", encoding="utf-8") as handle:
            json.dump({"rank": rank, "start": start, "losses": losses, "digest": _digest(model),
                       "policy": policy}, handle)
    commsched.shutdown()
