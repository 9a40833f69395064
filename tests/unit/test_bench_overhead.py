"""The overhead benchmark's round length: more steps per round where a step is short."""

from __future__ import annotations

import time

import torch
from torch import nn

from commsched.bench import overhead


class _Slow(nn.Module):
    """A model whose forward takes at least `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x * self.weight


def _plain(seconds: float) -> tuple[overhead.Candidate, overhead.Workload]:
    model = _Slow(seconds)
    work = overhead.Workload("slow", lambda: model, lambda step: (torch.ones(2), None),
                             lambda out, _: out.sum())
    return overhead.Candidate("plain", model, torch.optim.SGD(model.parameters(), lr=0.1)), work


def test_steps_per_round_fill_the_round_and_keep_the_least() -> None:
    plain, work = _plain(0.002)
    cpu = torch.device("cpu")
    # A sleep only overshoots: at most 200 ms / 2 ms steps; at least 20 unless a step took
    # over 10 ms.
    steps = overhead.steps_per_round(plain, work, cpu, False, round_s=0.2, least=3)
    assert 20 <= steps <= 100
    assert overhead.steps_per_round(plain, work, cpu, False, round_s=0.001, least=4) == 4
