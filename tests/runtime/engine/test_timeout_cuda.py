"""A device collective that times out raises the engine's error (issue 58, item 3).

Two ranks train with Gloo on CUDA tensors; from step 3 rank 1 stops stepping and sleeps past
COMMSCHED_TIMEOUT. Rank 0's step must raise commsched's RankFailureError naming the timeout,
and both processes must then exit normally: a run on an H200 once ended with both ranks dead of
SIGSEGV instead (Note [A failed collective is not touched again] in csrc/engine.cpp: the
collective that timed out is never waited on, unpacked or freed again).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from cuda_models import base_optimizer, loss_of, mlp
from helpers import distributed_test

pytestmark = [pytest.mark.gpu, pytest.mark.processes]

TIMEOUT_S = 5


def _stall_at_step_3() -> dict:
    import commsched

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    model = mlp()
    opt = commsched.DistributedOptimizer(base_optimizer(model),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="dear", profile_steps=1)
    for step in range(6):
        if rank == 1 and step == 3:
            time.sleep(3 * TIMEOUT_S)  # past rank 0's timeout, then leave without a word
            return {"rank": 1, "stalled": True}
        opt.zero_grad()
        try:
            loss_of(model, step, rank).backward()
            opt.step()
            opt.flush()  # dear's all-gathers: the timeout shows here at the latest
        except commsched.RankFailureError as err:
            torch.cuda.synchronize()  # the device is still usable: nothing touches the failed work
            return {"rank": rank, "error": str(err), "step": step}
    return {"rank": rank, "error": None}


def test_a_timed_out_device_collective_raises() -> None:
    results = distributed_test(_stall_at_step_3, world_size=2, timeout=120.0,
                               env={"COMMSCHED_TIMEOUT": str(TIMEOUT_S)})
    assert results[1]["stalled"]
    error = results[0]["error"]
    assert error is not None and results[0]["step"] == 3, results[0]
    assert "COMMSCHED_TIMEOUT" in error or "rank 1" in error, error
