"""Sparse gradients without sparse_as_dense on two Gloo ranks: the all-gathered sparse gradient
gives the same training as the dense average, also when one rank did not use the embedding in
a step (it contributes zero rows), for a synchronous and an overlap policy; a dead peer during
the exchange is an error naming it, not a hang. Horovod parity: tests/jobs/edge_cases_job.py."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

STEPS = 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.embed = nn.Embedding(30, 6, sparse=True)
        self.head = nn.Linear(6, 2)

    def forward(self, tokens: torch.Tensor, use_embed: bool) -> torch.Tensor:
        x = self.embed(tokens).mean(1) if use_embed else torch.ones(tokens.shape[0], 6)
        return self.head(x)


def _train(policy: str, sparse_as_dense: bool, rank: int) -> tuple[list[torch.Tensor], list]:
    import commsched

    model = Net()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, sparse_as_dense=sparse_as_dense,
                                         profile_steps=1)
    seen = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(10 * step + rank)
        tokens = torch.randint(0, 30, (4, 3), generator=gen)
        opt.zero_grad()
        # Step 2: rank 1 leaves the embedding out, so it has no gradient for it.
        out = model(tokens, use_embed=not (step == 2 and rank == 1))
        nn.functional.mse_loss(out, torch.randn(4, 2, generator=gen)).backward()
        if policy == "horovod":
            opt.synchronize()
            grad = model.embed.weight.grad
            assert grad is not None  # synchronize() gives every rank the reduced gradient
            seen.append((grad.is_sparse, grad._nnz() if grad.is_sparse else None))
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    opt.flush()
    opt.session.close()
    return [p.detach().clone() for p in model.parameters()], seen


def _job() -> dict:
    import commsched

    rank = commsched.init().rank
    out = {}
    for policy in ("horovod", "bytescheduler"):
        sparse, seen = _train(policy, False, rank)
        dense, _ = _train("horovod", True, rank)
        diff = max(float((a - b).abs().max()) for a, b in zip(sparse, dense, strict=True))
        out[policy] = {"diff": diff, "seen": seen}
    return out


def test_sparse_gradients_are_all_gathered_and_averaged() -> None:
    results = distributed_test(_job, 2, timeout=90)
    for rank, out in results.items():
        for policy, case in out.items():
            assert case["diff"] < 1e-6, (rank, policy, case["diff"])
        # Uncoalesced concatenation of both ranks' 12 rows (4 x 3 tokens); 12 in step 2.
        assert out["horovod"]["seen"] == [(True, 24), (True, 24), (True, 12), (True, 24)], out


def _dying_job() -> dict:
    import os
    import time

    import commsched

    rank = commsched.init().rank
    model = Net()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters(), model=model,
                                         profile_steps=1, timeout=20)
    model(torch.tensor([[1, 2]]), True).sum().backward()
    if rank == 1:
        os._exit(3)
    started = time.monotonic()
    try:
        opt.step()
    except commsched.RankFailureError as err:
        return {"error": str(err), "seconds": time.monotonic() - started}
    return {"error": None}


def test_dead_peer_during_sparse_exchange_is_an_error() -> None:
    out = distributed_test(_dying_job, 2, timeout=60, may_die=(1,))[0]
    assert out["error"] is not None and "rank 1's process (pid " in out["error"], out
    assert out["seconds"] < 25, out
