"""Uneven inputs (commsched/join.py, Note [Answering the others' collectives] in
runtime/step_vote.py): on 2 Gloo ranks holding different numbers of batches, every policy ends
where DDP's Join ends on the same data, on both ranks, with either form (the Join block, or
uneven_inputs=True and join() after the loop), and the ranks then train on together."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

POLICIES = ["horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"]
# Rank 0 runs out first: its last iterations' collectives are answered by a joined rank, after
# the plans settled (profile_steps=2, refine_steps=4) and, for rank 1, while `auto` still measures.
BATCHES = {0: 9, 1: 14}
AFTER = 3  # an epoch everyone trains in full after the join
TOLERANCE = 1e-6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.embed = nn.Linear(10, 24)
        self.body = nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh())
        self.head = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(x)))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(500 * step + rank)
    return torch.randn(6, 10, generator=gen), torch.randn(6, 3, generator=gen)


def _epochs(rank: int) -> list[list[int]]:
    """The steps each epoch gives `rank`: uneven, then even."""
    first = list(range(BATCHES[rank]))
    return [first, list(range(100, 100 + AFTER))]


def _ddp(rank: int) -> list[list[torch.Tensor]]:
    """DDP's Join, the parameters after each epoch. A rank that joined keeps the momentum of its
    own last step under DDP; the last joiner's optimizer state is sent to it after the block,
    as commsched's joined rank, which steps on the average, holds it (Note [Answering the
    others' collectives])."""
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    net = Net()
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    after = []
    for steps in _epochs(rank):
        with Join([ddp]):
            for step in steps:
                opt.zero_grad()
                x, y = _batch(step, rank)
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
        after.append([p.detach().clone() for p in net.parameters()])
        state = [opt.state_dict()]
        dist.broadcast_object_list(state, src=1)  # rank 1 held more batches
        opt.load_state_dict(state[0])
    return after


def _commsched(policy: str, form: str, rank: int) -> dict[str, Any]:
    import commsched

    net = Net()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
        named_parameters=net.named_parameters(), model=net, policy=policy, profile_steps=2,
        refine_steps=4, uneven_inputs=form == "call")
    last: list[int | None] = []
    after = []

    def epoch(steps: list[int]) -> None:
        for step in steps:
            opt.zero_grad()
            x, y = _batch(step, rank)
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()

    for steps in _epochs(rank):
        if form == "call":
            epoch(steps)
            last.append(commsched.join(opt))
        else:
            block = commsched.Join(opt)
            with block:
                epoch(steps)
            last.append(block.last_joined)
        opt.flush()
        after.append([p.detach().clone() for p in net.parameters()])
    out = {"params": after, "last": last, "iteration": opt.session.state.iteration}
    opt.session.close()
    return out


def _job() -> dict[str, Any]:
    import commsched

    commsched.init()
    rank = commsched.rank()
    out: dict[str, Any] = {"ddp": _ddp(rank)}
    for policy in POLICIES:
        out[f"{policy}/block"] = _commsched(policy, "block", rank)
    for policy in ("horovod", "dear"):
        out[f"{policy}/call"] = _commsched(policy, "call", rank)
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return distributed_test(_job, world_size=2, timeout=300)


CASES = [f"{p}/block" for p in POLICIES] + ["horovod/call", "dear/call"]


@pytest.mark.parametrize("case", CASES)
def test_uneven_inputs_train_as_ddp_join(results: dict[int, dict[str, Any]], case: str) -> None:
    for rank in (0, 1):
        got = results[rank][case]
        for epoch, (params, reference) in enumerate(zip(got["params"], results[rank]["ddp"],
                                                        strict=True)):
            diff = max(float((p - q).abs().max())
                       for p, q in zip(params, reference, strict=True))
            print(f"{case} rank {rank} epoch {epoch}: {diff:.3g} from DDP's Join")
            assert diff <= TOLERANCE, (case, rank, epoch, diff)
        assert got["last"] == [1, 1], got["last"]  # rank 1 held more batches; then a tie
        # Every rank ran the longer rank's iterations: its own and the ones it answered.
        assert got["iteration"] == BATCHES[1] + AFTER, got["iteration"]


def _without_join() -> dict[str, Any]:
    """Uneven inputs without join(): rank 0 stops after 3 steps and ends; rank 1's 4th step must
    fail within the timeout, naming rank 0, instead of hanging."""
    import time

    import commsched

    commsched.init()
    rank = commsched.rank()
    net = Net()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), named_parameters=net.named_parameters(),
        model=net, policy="horovod", profile_steps=0)
    started = time.monotonic()
    try:
        for step in range(3 if rank == 0 else 6):
            started = time.monotonic()
            opt.zero_grad()
            x, y = _batch(step, rank)
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    except commsched.RankFailureError as err:
        return {"error": str(err), "step": step, "seconds": time.monotonic() - started}
    return {"error": None}


def test_uneven_inputs_without_join_fail_naming_the_rank_that_stopped() -> None:
    results = distributed_test(_without_join, world_size=2, timeout=60,
                               env={"COMMSCHED_TIMEOUT": "3"})
    assert results[0]["error"] is None
    got = results[1]
    assert got["error"] is not None and got["step"] == 3, got
    assert "rank 0" in got["error"], got["error"]
    assert got["seconds"] < 3 + 10, got
