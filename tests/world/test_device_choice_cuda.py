"""init() on a GPU host (Note [The device before the group] in world/devices.py): an NCCL world
selects cuda:local_rank before its group, a script's own choice stays, COMMSCHED_BACKEND=gloo
keeps Gloo, and Horovod's calls on a script's tensors run on CUDA and CPU tensors alike."""

from __future__ import annotations

import pytest
import torch
from cuda_models import RANK_ENV, RANK_TIMEOUT_S
from helpers import distributed_test

pytestmark = [pytest.mark.gpu, pytest.mark.processes]


def _nccl_world_of_one() -> dict:
    import torch.distributed as dist

    import commsched

    untouched = not torch.cuda.is_initialized()
    world = commsched.init()
    device = torch.cuda.current_device()
    metric = commsched.allreduce(torch.ones(3, device="cuda"))
    cpu_metric = commsched.allreduce(torch.ones(3))  # over the Gloo control group
    return {"untouched": untouched, "backend": dist.get_backend(world.process_group),
            "device": device, "expected": world.local_rank % torch.cuda.device_count(),
            "metric": metric.cpu(), "metric_device": metric.device.type,
            "cpu_metric": cpu_metric}


def test_an_nccl_world_selects_the_local_ranks_gpu_before_its_group() -> None:
    got = distributed_test(_nccl_world_of_one, world_size=1, timeout=RANK_TIMEOUT_S,
                           env={**RANK_ENV, "COMMSCHED_BACKEND": "nccl"})[0]
    assert got["untouched"] and got["backend"] == "nccl", got
    assert got["device"] == got["expected"], got
    assert got["metric_device"] == "cuda" and torch.equal(got["metric"], torch.ones(3))
    assert torch.equal(got["cpu_metric"], torch.ones(3))


def _script_chose_first() -> dict:
    import commsched

    chosen = torch.cuda.device_count() - 1
    torch.cuda.set_device(chosen)  # the script's own choice: CUDA is initialised now
    commsched.init()
    return {"chosen": chosen, "device": torch.cuda.current_device()}


def test_a_device_the_script_chose_stays() -> None:
    got = distributed_test(_script_chose_first, world_size=1, timeout=RANK_TIMEOUT_S,
                           env={**RANK_ENV, "COMMSCHED_BACKEND": "nccl"})[0]
    assert got["device"] == got["chosen"], got


def _gloo_on_a_gpu_host() -> dict:
    import torch.distributed as dist

    import commsched

    world = commsched.init()
    summed = commsched.allreduce(torch.full((2,), float(world.rank + 1), device="cuda"),
                                 op=commsched.Sum)
    return {"backend": dist.get_backend(world.process_group), "summed": summed.cpu()}


def test_commsched_backend_gloo_keeps_gloo_on_a_gpu_host() -> None:
    results = distributed_test(_gloo_on_a_gpu_host, world_size=2, timeout=RANK_TIMEOUT_S,
                               env={**RANK_ENV, "COMMSCHED_BACKEND": "gloo"})
    for got in results.values():
        assert got["backend"] == "gloo", got
        assert torch.equal(got["summed"], torch.tensor([3.0, 3.0])), got
