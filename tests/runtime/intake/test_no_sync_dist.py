"""Gradient accumulation on 2 Gloo ranks: ``opt.no_sync()`` against DDP's ``no_sync()`` in the
same job, under every policy, and Horovod's ``backward_passes_per_step`` beside them.

Each step runs MICRO micro-batches: the first MICRO - 1 inside ``no_sync()``, the last outside,
so that the last backward hands over the sum. After STEPS steps the loop ends with a partial
accumulation (the end of an epoch): ``zero_grad()`` then warns that it drops it, and a second
partial accumulation followed by ``step()`` is averaged across ranks, not applied locally.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

STEPS = 5
MICRO = 3
POLICIES = ["horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"]


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                         nn.Linear(24, 2))


def _loss(model: nn.Module, step: int, micro: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
    x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 2, generator=gen)
    return nn.functional.mse_loss(model(x), y) / MICRO


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _ddp_run(rank: int) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = _model()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(MICRO - 1):
            with ddp.no_sync():
                _loss(ddp, step, micro, rank).backward()
        _loss(ddp, step, MICRO - 1, rank).backward()
        opt.step()
    return _params(model)


def _commsched_run(rank: int, policy: str, passes: bool) -> dict[str, Any]:
    import commsched

    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), model=model, policy=policy, profile_steps=2,
        backward_passes_per_step=MICRO if passes else 1)
    for step in range(STEPS):
        opt.zero_grad()
        if passes:  # Horovod's way: every pass counted, the last one sends
            for micro in range(MICRO - 1):
                _loss(model, step, micro, rank).backward()
        else:  # the README's
            with opt.no_sync():
                for micro in range(MICRO - 1):
                    _loss(model, step, micro, rank).backward()
        _loss(model, step, MICRO - 1, rank).backward()
        opt.step()
    opt.flush()
    out: dict[str, Any] = {"params": _params(model)}
    if not passes:
        out.update(_end_of_epoch(model, opt, rank))
    opt.session.close()
    return out


def _end_of_epoch(model: nn.Module, opt: Any, rank: int) -> dict[str, Any]:
    """A partial accumulation dropped by zero_grad(), then one that step() averages."""
    for micro in range(2):
        with opt.no_sync():
            _loss(model, STEPS, micro, rank).backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.zero_grad()
    before = _params(model)
    for micro in range(2):
        with opt.no_sync():
            _loss(model, STEPS + 1, micro, rank).backward()
    opt.step()
    opt.flush()
    moved = max(float((a - b).abs().max()) for a, b in zip(before, _params(model), strict=True))
    return {"dropped": [str(w.message) for w in caught], "after_partial": _params(model),
            "moved": moved}


def _no_sync_after_send(rank: int) -> str:
    import commsched

    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    _loss(model, 0, 0, rank).backward()
    try:
        with opt.no_sync():
            pass
    except RuntimeError as err:
        return str(err)
    finally:
        opt.step()
        opt.session.close()
    return "no error"


def _job() -> dict[str, Any]:
    import commsched

    rank = commsched.init().rank
    out: dict[str, Any] = {"torch ddp": _ddp_run(rank)}
    for policy in POLICIES:
        out[policy] = _commsched_run(rank, policy, passes=False)
    out["horovod passes"] = _commsched_run(rank, "horovod", passes=True)
    out["bytescheduler passes"] = _commsched_run(rank, "bytescheduler", passes=True)
    out["after send"] = _no_sync_after_send(rank)
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return distributed_test(_job, world_size=2, timeout=180)


def _diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("policy", POLICIES + ["horovod passes", "bytescheduler passes"])
def test_accumulation_matches_ddp_no_sync(results: dict[int, dict[str, Any]],
                                          policy: str) -> None:
    for rank in (0, 1):
        assert _diff(results[rank][policy]["params"], results[rank]["torch ddp"]) == 0.0, rank


@pytest.mark.parametrize("policy", POLICIES)
def test_a_partial_accumulation_warns_at_zero_grad_and_step_averages_it(
        results: dict[int, dict[str, Any]], policy: str) -> None:
    for rank in (0, 1):
        dropped = results[rank][policy]["dropped"]
        assert len(dropped) == 1 and "call optimizer.step() before zero_grad()" in dropped[0], \
            dropped
        assert results[rank][policy]["moved"] > 0
    # Each rank accumulated other data: a local step would leave the ranks apart.
    assert _diff(results[0][policy]["after_partial"], results[1][policy]["after_partial"]) == 0


def test_no_sync_after_a_sending_backward_is_refused(results: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        assert "no_sync() was entered after a backward pass" in results[rank]["after send"]
