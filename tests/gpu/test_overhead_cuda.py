"""The overhead benchmark's free-running clock on a GPU (Note [Two clocks on a GPU]): with no
synchronisation between steps the host only queues work, so a clock that read the host's time
would see microseconds; the CUDA events must see the device's time, here a known sleep."""

from __future__ import annotations

import torch
from torch import nn

from commsched.bench import overhead

SLEEP_CYCLES = 5_000_000  # about 2-4 ms at the clock rates of current data-centre GPUs


class _DeviceSleep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, device="cuda"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(SLEEP_CYCLES)
        return x * self.weight


def test_free_running_clock_sees_the_device_time() -> None:
    model = _DeviceSleep()
    work = overhead.Workload("sleep", lambda: model,
                             lambda step: (torch.ones(4, device="cuda"), None),
                             lambda out, _: out.sum())
    plain = overhead.Candidate("plain", model, torch.optim.SGD(model.parameters(), lr=0.1))
    overhead.run([plain], work, torch.device("cuda"), warmup=2, rounds=2, steps=5,
                 autocast=False, free_running=True)
    synced, free = min(plain.medians), min(plain.free_medians)
    assert synced > 1e-3, synced  # the sleep, on the wall clock
    # The same steps, run ahead of the device: the events still see each sleep.
    assert 0.5 * synced < free < 1.5 * synced, (synced, free)
