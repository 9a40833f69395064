"""A wrapped optimizer that is dropped releases its engine's threads and its process groups (the
engine's and the sparse route's) once it is collected, also while its model lives on: 20 wraps
in one process leave the thread count where it started (Horovod's tests wrap a new optimizer in
every loop; before, each kept its threads until commsched.shutdown())."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from helpers import distributed_test

pytestmark = pytest.mark.processes

WRAPS = 20


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))  # every thread of the process, C++ ones included


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 3, sparse=True)
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(tokens))


def _job() -> dict:
    import commsched
    from commsched.world import registry

    commsched.init()
    start = _threads()
    model = _Net()  # kept across every wrap: its hooks must not keep a dropped wrapper alive
    peak = start
    for i in range(WRAPS):
        # Odd wraps route the embedding's sparse gradient through a group of its own (model=).
        opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             model=model if i % 2 else None)
        model(torch.tensor([[1, 2], [3, 4]])).sum().backward()
        opt.step()
        opt.zero_grad()
        peak = max(peak, _threads())
        del opt
        gc.collect()
    # With no optimizer left, a backward pass reaches no engine (the hooks went with them).
    model(torch.tensor([[1, 2]])).sum().backward()
    return {"start": start, "peak": peak, "end": _threads(),
            "engines": len(registry.participants())}


def test_dropped_optimizers_release_their_threads_and_groups() -> None:
    for rank, out in distributed_test(_job, world_size=2, timeout=120).items():
        assert out["peak"] > out["start"], f"rank {rank}: a live optimizer shows no threads"
        assert out["end"] == out["start"], f"rank {rank}: {out}"
        assert out["engines"] == 0, f"rank {rank}: {out}"
