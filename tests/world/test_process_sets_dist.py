"""process_set= on 3 Gloo ranks: gradients are averaged within the set only (a group of its
members, made by them alone), a rank outside it steps on its own gradients, as with Horovod, and
broadcast_object takes a process set with a global root."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test

pytestmark = pytest.mark.processes

STEPS = 3


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same start on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _reference(ranks: list[int]) -> list[torch.Tensor]:
    """Plain SGD on the gradient averaged over `ranks`, replayed in one process."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        grads = []
        for rank in ranks:
            model.zero_grad()
            x, y = _data(rank, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                          for p in model.parameters()])
        for p, *per_rank in zip(model.parameters(), *grads, strict=True):
            p.grad = torch.stack(per_rank).mean(dim=0)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _job(sets: dict[int, list[int]]) -> dict:
    import commsched

    commsched.init()
    rank = commsched.rank()
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         process_set=sets[rank])
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _data(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    members = sets[rank]
    root = members[-1] if rank in members else rank
    shared = commsched.broadcast_object({"from": rank}, root_rank=root, process_set=members) \
        if rank in members else None
    # Rank 0 hosts the job's store here (MASTER_ADDR and MASTER_PORT). Outside the set it is done
    # first, and had it left then, it would have taken the store from the members still making
    # their group ("Broken pipe"). A job's ranks end together, as Horovod's do.
    torch.distributed.barrier()
    return {"params": [p.detach().clone() for p in model.parameters()], "shared": shared,
            "size": opt.session.world.size}


@pytest.mark.parametrize("sets", [
    {0: [1, 2], 1: [1, 2], 2: [1, 2]},  # every rank names the set; rank 0 is outside it
    {0: [0, 1], 1: [0, 1], 2: [2]},  # each rank names its own set (Horovod's even/odd style)
], ids=["one-set-named-by-all", "each-rank-its-own-set"])
def test_gradients_are_averaged_within_the_process_set_only(sets: dict[int, list[int]]) -> None:
    results = distributed_test(_job, world_size=3, timeout=120, args=(sets,))
    for rank, out in results.items():
        inside = rank in sets[rank]
        expected = _reference(sets[rank] if inside else [rank])
        for got, want in zip(out["params"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert out["size"] == (len(sets[rank]) if inside else 1)
        if inside:
            assert out["shared"] == {"from": sets[rank][-1]}
    # The sets really differ: a rank outside the set, or in another set, ends elsewhere.
    assert not torch.allclose(results[0]["params"][0], results[2]["params"][0])


def _bad_set_job() -> str:
    import commsched

    commsched.init()
    model = torch.nn.Linear(2, 2)
    try:
        commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       process_set=[0, 5])
    except ValueError as err:
        return str(err)
    return "no error"


def test_a_process_set_with_an_unknown_rank_is_refused() -> None:
    results = distributed_test(_bad_set_job, world_size=2, timeout=60)
    assert all("must hold ranks of 0..1" in text for text in results.values())
