"""Fault injection on spawned Gloo ranks: a rank that dies (os._exit) in backward, in step() or
in an overlap-mode forward; a rank that stalls past COMMSCHED_STALL_WARNING; a rank that stalls
past COMMSCHED_TIMEOUT. The survivors must raise an error naming the missing rank and the blocks
they waited for, within COMMSCHED_TIMEOUT + 10 s, and never hang."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import distributed_test

TIMEOUT = 20.0  # COMMSCHED_TIMEOUT for these jobs


def _dying_job(policy: str, phase: str) -> dict:
    import os

    import torch
    from torch import nn

    import commsched

    rank = commsched.init().rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=2, timeout=TIMEOUT)
    step = 0
    if rank == 1 and phase == "backward":
        model[0].weight.register_hook(lambda g: os._exit(3) if step >= 4 else None)
    if rank == 1 and phase == "forward":
        model[2].register_forward_pre_hook(lambda m, a: os._exit(3) if step >= 4 else None)
    started = time.monotonic()
    try:
        for step in range(8):
            if rank == 1 and phase == "step" and step == 4:
                os._exit(3)
            opt.zero_grad()
            model(torch.randn(8, 16)).square().mean().backward()
            started = time.monotonic()
            opt.step()
        opt.flush()
    except commsched.RankFailureError as err:
        return {"error": str(err), "seconds": time.monotonic() - started}
    return {"error": None}


CASES = [("horovod", "backward"), ("horovod", "step"), ("ddp", "backward"), ("mgwfbp", "step"),
         ("bytescheduler", "forward"), ("bytescheduler", "step"), ("prophet", "forward"),
         ("dear", "forward"), ("dear", "backward"), ("auto", "step")]


def test_dead_rank_is_named_with_the_blocks_waited_for() -> None:
    def one(case: tuple[str, str]) -> dict:
        return distributed_test(_dying_job, world_size=2, timeout=TIMEOUT + 40, args=case,
                                may_die=(1,))[0]

    with ThreadPoolExecutor(max_workers=3) as pool:  # each job mostly waits: run a few at once
        outcomes = dict(zip(CASES, pool.map(one, CASES), strict=True))
    for case, out in outcomes.items():
        assert out["error"] is not None, f"{case}: rank 0 finished although rank 1 died"
        assert "rank 1 stopped responding" in out["error"], (case, out["error"])
        assert "block " in out["error"], (case, out["error"])  # the blocks it waited for
        assert out["seconds"] < TIMEOUT + 10, (case, out["seconds"])


def _stalling_job(stall_s: float) -> dict:
    import logging

    import torch
    from torch import nn

    import commsched

    rank = commsched.init().rank
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logging.getLogger("commsched").addHandler(Collect())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         policy="horovod", profile_steps=0)
    error = None
    try:
        for step in range(4):
            opt.zero_grad()
            out = model(torch.randn(8, 16, generator=torch.Generator().manual_seed(step)))
            if rank == 1 and step == 2:  # late with the first layer's gradient
                model[0].weight.register_hook(lambda g: time.sleep(stall_s))
            out.square().mean().backward()
            opt.step()
    except commsched.RankFailureError as err:
        error = str(err)
    return {"warnings": [m for m in seen if "stall" in m], "error": error,
            "params": [p.detach().clone() for p in model.parameters()] if error is None else None}


def test_stalled_rank_warns_on_rank_0_and_the_job_continues() -> None:
    results = distributed_test(_stalling_job, world_size=2, timeout=90, args=(4.0,),
                               env={"COMMSCHED_STALL_WARNING": "1.5", "COMMSCHED_TIMEOUT": "30"})
    assert results[0]["error"] is None and results[1]["error"] is None
    assert results[0]["warnings"], "rank 0 did not warn about the stalled rank"
    assert "rank 1: missing '0.weight'" in results[0]["warnings"][0], results[0]["warnings"][0]
    assert not results[1]["warnings"]  # the inspector is rank 0's
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert a.equal(b)


@pytest.mark.parametrize("stall_s", [8.0])
def test_rank_stalled_past_the_timeout_is_an_error_not_a_hang(stall_s: float) -> None:
    results = distributed_test(_stalling_job, world_size=2, timeout=90, args=(stall_s,),
                               env={"COMMSCHED_TIMEOUT": "3", "COMMSCHED_STALL_WARNING": "0"},
                               expect_errors=True)
    error = results[0]["error"]
    assert error is not None and "timed out after 3 s" in error, error
    assert "every peer still sends heartbeats" in error  # alive but late: not a dead rank
    assert "0.weight" in error or "block" in error
