"""The profile's fitted beta on CUDA tensors (2 Gloo ranks: device-to-host copies, the sum on
the host, the copy back) is within 2x of bytes / duration of the same allreduce timed here with
CUDA events; and the profile says its figures came from device events."""

from __future__ import annotations

import statistics

import pytest
import torch
from cuda_models import RANK_ENV, RANK_TIMEOUT_S
from helpers import distributed_test
from torch import nn

pytestmark = [pytest.mark.gpu, pytest.mark.processes]

WIDTH = 1024  # 4 MiB per weight: the per-byte cost dominates the start-up cost
STEPS = 6


def _events_beta(group: object, nbytes: int, repeats: int = 5) -> float:
    """Seconds per byte of a CUDA-tensor allreduce of `nbytes`, from events around it."""
    import torch.distributed as dist

    buffer = torch.ones(nbytes // 4, device="cuda")
    times = []
    for _ in range(repeats + 1):  # the first is warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(buffer, group=group)  # type: ignore[arg-type]
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[1:]) / nbytes


def _job() -> dict:
    import torch.distributed as dist

    import commsched

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="env://")
    rank = commsched.init().rank
    torch.manual_seed(3)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)]).cuda()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters(),
                                         policy="mgwfbp", profile_steps=STEPS)
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(step + 10 * rank))
        model(x.cuda()).square().mean().backward()
        opt.step()
    doc = opt.session.profile_document()
    opt.session.close()
    return {"doc": doc, "beta": _events_beta(dist.group.WORLD, WIDTH * WIDTH * 4)}


def test_fitted_beta_matches_cuda_events() -> None:
    results = distributed_test(_job, world_size=2, timeout=RANK_TIMEOUT_S, env=RANK_ENV)
    for rank, result in results.items():
        doc = result["doc"]
        assert doc["clocks"]["collective_s"] == "device_event", doc["clocks"]
        assert doc["clocks"]["ready_time_s"] == "device_event", doc["clocks"]
        allreduce = doc["collectives"]["allreduce"]
        assert allreduce["clock"] == "device_event"
        fitted, measured = allreduce["beta_s_per_byte"], result["beta"]
        assert measured > 0 and 0.5 * measured <= fitted <= 2 * measured, \
            f"rank {rank}: fitted beta {fitted:.3e} s/B, CUDA events {measured:.3e} s/B"
