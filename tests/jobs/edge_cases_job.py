"""Runs under ``horovodrun -np 2 --gloo``: gradient edge cases against hvd.DistributedOptimizer
with the same settings, for every policy; writes each case's largest difference to argv[1].

One model holds them all: fp32, fp64 and fp16 layers (Horovod 0.28.1 rejects bf16 tensors:
"Tensor type torch.BFloat16Tensor is not supported", so bf16 gradients have no Horovod twin); a
channels-last convolution; a parameter stored transposed (non-contiguous gradient); a
zero-element parameter; a branch used only on even steps; a layer frozen (requires_grad=False)
for two steps; a sparse embedding; zero_grad alternating set_to_none True and False. A second
model is wrapped in the same process and trained in turn with the first. The first model's
embedding is reduced with sparse_as_dense=True, the second's without it: all-gathered as a sparse
gradient (Horovod's sparse_allreduce_async), which the optimizer then applies with momentum 0
(that parameter group) to a sparse gradient.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import torch
from job_results import gather_and_write, run_case
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer

STEPS = 6
POLICIES = ["horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"]
KNOBS: dict[str, Any] = {"profile_steps": 2, "partition_bytes": 256, "fusion_threshold": 512,
                         "credit_bytes": 1024}


class EdgeNet(nn.Module):
    """`strided`: the convolution channels-last and `transposed` a transposed view, so their
    gradients are not contiguous. Horovod rejects such tensors ("Tensor is required to be
    contiguous"), so its twin holds the same values in the default layout."""

    def __init__(self, strided: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, sparse=True)
        self.conv = nn.Conv2d(3, 4, 3)
        weight = torch.randn(8, 36)
        self.transposed = nn.Parameter(weight.t() if strided else weight.t().contiguous())
        if strided:
            # Module.to takes memory_format at run time; torch's overloads leave it out.
            self.conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.lin_fp16 = nn.Linear(8, 8).half()
        self.lin_fp64 = nn.Linear(8, 8).double()
        self.sometimes = nn.Linear(8, 8)
        self.frozen_later = nn.Linear(8, 8)
        self.empty = nn.Parameter(torch.zeros(0))
        self.head = nn.Linear(8, 3)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor, step: int) -> torch.Tensor:
        x = torch.relu(self.conv(image))
        x = nn.functional.adaptive_avg_pool2d(x, 3).flatten(1) @ self.transposed
        x = x + self.embed(tokens).mean(1)
        x = x + self.lin_fp16(x.half()).float() + self.lin_fp64(x.double()).float()
        if step % 2 == 0:
            x = x + self.sometimes(x)
        x = self.frozen_later(x) + self.empty.sum()
        return self.head(x)


def data(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + hvd.rank())
    return (torch.randn(4, 3, 7, 7, generator=gen), torch.randint(0, 20, (4, 5), generator=gen),
            torch.randint(0, 3, (4,), generator=gen))


def build(seed: int, strided: bool) -> EdgeNet:
    torch.manual_seed(seed)
    return EdgeNet(strided)


def zero_grad(opt: torch.optim.Optimizer, model: nn.Module, set_to_none: bool) -> None:
    if hasattr(opt, "flush"):  # commsched's wrapper takes torch's signature
        opt.zero_grad(set_to_none=set_to_none)
    elif set_to_none:  # Horovod's zero_grad() takes no arguments and sets grads to None
        opt.zero_grad()
    else:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.detach_().zero_()


def sgd(model: EdgeNet, sparse_as_dense: bool) -> torch.optim.Optimizer:
    if sparse_as_dense:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A sparse gradient goes to the optimizer: its parameter group takes plain SGD.
    rest = [p for name, p in model.named_parameters() if not name.startswith("embed.")]
    groups: list[dict[str, Any]] = [{"params": [model.embed.weight], "momentum": 0.0},
                                    {"params": rest}]
    return torch.optim.SGD(groups, lr=0.05, momentum=0.9)


SPARSE_AS_DENSE = (True, False)  # per model
# Wraps (optimizer, model, sparse_as_dense): Horovod's DistributedOptimizer or commsched's.
Wrap = Callable[[torch.optim.Optimizer, EdgeNet, bool], torch.optim.Optimizer]


def train(wrap: Wrap, strided: bool) -> list[EdgeNet]:
    models = [build(1, strided), build(2, strided)]  # two models, two wrappers, one process
    opts = [wrap(sgd(m, dense), m, dense) for m, dense in zip(models, SPARSE_AS_DENSE, strict=True)]
    for step in range(STEPS):
        for model, opt in zip(models, opts, strict=True):
            model.frozen_later.requires_grad_(step not in (2, 3))
            zero_grad(opt, model, set_to_none=step % 2 == 0)
            image, tokens, target = data(step)
            nn.functional.cross_entropy(model(image, tokens, step).float(), target).backward()
            opt.step()
    for opt in opts:
        if isinstance(opt, _DistributedOptimizer):  # commsched's, not Horovod's
            opt.flush()
            opt.session.close()
    return models


def compare(policy: str) -> dict:
    expected = train(lambda opt, m, dense: hvd.DistributedOptimizer(
        opt, named_parameters=m.named_parameters(), sparse_as_dense=dense), strided=False)
    actual = train(lambda opt, m, dense: commsched.DistributedOptimizer(
        opt, named_parameters=m.named_parameters(), model=m, policy=policy, sparse_as_dense=dense,
        **KNOBS), strided=True)
    diffs = {}
    ok = True
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        for (name, a), (_, b) in zip(got.named_parameters(), want.named_parameters(), strict=True):
            fa, fb = a.detach().float(), b.detach().float()
            diffs[f"model{index}.{name}"] = float((fa - fb).abs().max()) if fa.numel() else 0.0
            tol = (1e-2, 1e-2) if name.startswith("lin_fp16") else (1e-5, 1e-6)
            ok &= torch.allclose(fa, fb, rtol=tol[0], atol=tol[1])
    return {"ok": bool(ok), "max_diff": max(diffs.values()), "diffs": diffs}


def main() -> None:
    torch.set_num_threads(1)
    commsched.init()
    results: dict[str, Any] = {}
    for policy in POLICIES:
        run_case(results, policy, functools.partial(compare, policy))
    gather_and_write(results, sys.argv[1], "edge.results")
    commsched.shutdown()


if __name__ == "__main__":
    main()
