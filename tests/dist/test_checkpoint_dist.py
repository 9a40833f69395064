"""Checkpoint and resume: a run saved at step K (model and wrapped optimizer state) and resumed in
a new job continues bit-identically to an uninterrupted run, for a synchronous and an overlap
policy. Two ranks: a sum of two values does not depend on how blocks are fused, so the resumed
job's fresh profiling steps cannot change a bit."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test
from torch import nn

K, M = 7, 6


def _model() -> nn.Module:
    torch.manual_seed(8)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))


def _train(policy: str, steps: range, checkpoint_in: str = "", checkpoint_out: str = "") -> list:
    import commsched

    rank = commsched.init().rank
    model = _model()
    base = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = commsched.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                         model=model, policy=policy, profile_steps=2)
    if checkpoint_in:
        state = torch.load(checkpoint_in.format(rank=rank), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    for step in steps:
        gen = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(8, 10, generator=gen)),
                               torch.randn(8, 2, generator=gen)).backward()
        opt.step()
    if checkpoint_out:  # state_dict() flushes pending overlap updates first
        torch.save({"optimizer": opt.state_dict(), "model": model.state_dict()},
                   checkpoint_out.format(rank=rank))
    opt.flush()  # type: ignore[attr-defined]
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("policy", ["horovod", "bytescheduler"])
def test_resumed_run_is_bit_identical(policy: str, tmp_path) -> None:
    path = str(tmp_path / "ckpt.rank{rank}.pt")
    whole = distributed_test(_train, 2, timeout=90, args=(policy, range(K + M)))
    distributed_test(_train, 2, timeout=90, args=(policy, range(K), "", path))
    resumed = distributed_test(_train, 2, timeout=90, args=(policy, range(K, K + M), path))
    for rank in (0, 1):
        for a, b in zip(whole[rank], resumed[rank], strict=True):
            assert torch.equal(a, b), (policy, rank, float((a - b).abs().max()))
