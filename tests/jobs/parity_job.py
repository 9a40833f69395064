"""Runs under ``horovodrun -np N --gloo``: trains the same model with hvd.DistributedOptimizer and
with commsched.DistributedOptimizer for every configuration, on the same per-rank data, and writes
the largest parameter difference of each to a JSON file (argv[1]) on rank 0.

Many configurations share one launch because spawning ranks costs seconds.
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Any

import horovod.torch as hvd
import torch
from job_results import gather_and_write, run_case
from torch import nn

import commsched

STEPS = 5
TOLERANCE = {"none": (1e-5, 1e-6), "fp16": (1e-2, 1e-3), "bf16": (5e-2, 1e-2)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.fc1 = nn.Linear(6 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 4)
        self.unused = nn.Linear(4, 4)  # never in the graph: reduced as zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 10 * micro + hvd.rank())
    return torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen)


def train(wrap, kind: str, bpps: int) -> nn.Module:
    torch.manual_seed(7)
    model = Net()
    opt = wrap(make_optimizer(kind, model), model)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(bpps):
            x, y = batch(step, micro)
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    session = getattr(opt, "session", None)
    if session is not None:
        session.close()
    return model


def hvd_compression(name: str):
    return hvd.Compression.fp16 if name == "fp16" else hvd.Compression.none


@functools.cache
def horovod_run(kind: str, bpps: int, compression: str, groups: int) -> nn.Module:
    """hvd.DistributedOptimizer's model: the same for every policy, so each configuration of
    Horovod is trained once per job."""
    def reference(opt, model):
        return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                        backward_passes_per_step=bpps,
                                        compression=hvd_compression(compression),
                                        groups=groups or None)

    return train(reference, kind, bpps)


def compare(policy: str, kind: str, bpps: int, compression: str, groups: int = 0,
            op=commsched.Average) -> dict:
    def ours(opt, model):
        return commsched.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(), backward_passes_per_step=bpps,
            compression=getattr(commsched.Compression, compression), policy=policy,
            profile_steps=2, op=op, groups=groups or None)

    expected = horovod_run(kind, bpps, compression, groups)
    actual = train(ours, kind, bpps)
    rtol, atol = TOLERANCE[compression]
    diffs = {}
    ok = True
    for (name, a), (_, b) in zip(actual.named_parameters(), expected.named_parameters(),
                                 strict=True):
        diffs[name] = float((a - b).detach().abs().max())
        ok &= torch.allclose(a, b, rtol=rtol, atol=atol)
    moved = float(max((p.detach() - q.detach()).abs().max()
                      for p, q in zip(expected.parameters(), Net().parameters(), strict=True)))
    return {"ok": bool(ok), "max_diff": max(diffs.values()), "diffs": diffs, "moved": moved}


POLICIES = ["horovod", "ddp", "mgwfbp"]
CONFIGS = (list(itertools.product(POLICIES, ["sgd", "adam"], [1, 2], ["none"], [0]))
           + list(itertools.product(POLICIES, ["sgd"], [1], ["fp16", "bf16"], [0]))
           + list(itertools.product(POLICIES, ["adam"], [1], ["none"], [2])))


def config_key(policy: str, kind: str, bpps: int, compression: str, groups: int) -> str:
    return f"{policy}-{kind}-bpps{bpps}-{compression}" + (f"-groups{groups}" if groups else "")


PARITY_KEYS = [config_key(*c) for c in CONFIGS]


def main() -> None:
    torch.set_num_threads(1)
    commsched.init()
    results: dict[str, Any] = {}
    for config in CONFIGS:
        run_case(results, config_key(*config), functools.partial(compare, *config))
    # Negative control: summing instead of averaging must be detected as a mismatch.
    run_case(results, "control-sum-vs-average",
             lambda: compare("horovod", "sgd", 1, "none", op=commsched.Sum))
    gather_and_write(results, sys.argv[1], "parity.results")
    commsched.shutdown()


if __name__ == "__main__":
    main()
