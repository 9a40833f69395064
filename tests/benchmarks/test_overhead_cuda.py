"""The overhead benchmark's free-running clock on a GPU (Note [Two clocks on a GPU]): with no
synchronisation between steps the host only queues work, so a clock that read the host's time
would see microseconds; the CUDA events must see the device's time, here a known sleep. And
nothing in the timed steps may drain the queue: the batches come from pageable host memory,
whose blocking copy would wait for the stream to empty if it ran inside them."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from benchmarks.harness import overhead

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 5_000_000  # about 2-4 ms at the clock rates of current data-centre GPUs
STEPS = 5


class _DeviceSleep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, device="cuda"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(SLEEP_CYCLES)
        return x * self.weight


def test_free_running_clock_sees_the_device_time() -> None:
    model = _DeviceSleep()
    queued: list[float] = []  # host time at each step's loss

    def loss(out: torch.Tensor, _: object) -> torch.Tensor:
        queued.append(time.perf_counter())
        return out.sum()

    work = overhead.Workload("sleep", lambda: model,
                             lambda step: (torch.ones(4).to("cuda"), None), loss)
    plain = overhead.Candidate("plain", model, torch.optim.SGD(model.parameters(), lr=0.1))
    overhead.run([plain], work, torch.device("cuda"), warmup=2, rounds=2, steps=STEPS,
                 autocast=False, free_running=True)
    synced, free = min(plain.medians), min(plain.free_medians)
    assert synced > 1e-3, synced  # the sleep, on the wall clock
    # The same steps, run ahead of the device: the events still see each sleep.
    assert 0.5 * synced < free < 1.5 * synced, (synced, free)
    # The last round's free-running steps were queued without waiting for the device: a wait
    # per step would spread them over (STEPS - 1) sleeps.
    spread = queued[-1] - queued[-STEPS]
    assert spread < 0.5 * (STEPS - 1) * synced, (spread, synced)
