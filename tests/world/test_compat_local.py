"""Pieces of the Horovod surface that need no peer: process-set arguments, Horovod's
broadcast_optimizer_state on a fresh optimizer, and Horovod's private `_parameter_names`."""

from __future__ import annotations

import pytest
import torch

import commsched
from commsched.world.process_sets import members_of


class _ProcessSet:
    """What commsched reads of Horovod's hvd.ProcessSet."""

    def __init__(self, ranks: list[int] | None, process_set_id: int | None = None) -> None:
        self.ranks = ranks
        self.process_set_id = process_set_id


def test_process_set_arguments() -> None:
    assert members_of(None, 4) is None
    assert members_of(_ProcessSet([], process_set_id=0), 4) is None  # hvd.global_process_set
    assert members_of(_ProcessSet([3, 1]), 4) == (1, 3)
    assert members_of([0, 1, 2, 3], 4) is None  # every rank: the world itself
    assert members_of((2,), 4) == (2,)
    with pytest.raises(ValueError, match="lists a rank twice"):
        members_of([1, 1], 4)
    with pytest.raises(ValueError, match="must hold ranks of 0..3"):
        members_of([0, 4], 4)
    with pytest.raises(ValueError, match="a list of ranks"):
        members_of(_ProcessSet(None), 4)  # an MPI-communicator set
    with pytest.raises(ValueError, match="a list of ranks"):
        members_of("0,1", 4)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_broadcast_optimizer_state_fills_a_fresh_state_without_moving_anything(
        momentum: float) -> None:
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    model = torch.nn.Sequential(first, second)
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, weight_decay=0.1),
        named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    first.weight.grad = torch.ones_like(first.weight)  # a gradient that must survive
    commsched.broadcast_optimizer_state(opt, root_rank=0)
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)  # weight decay on a zero gradient would have moved them
    assert torch.equal(first.weight.grad, torch.ones_like(first.weight))
    assert second.weight.grad is not None and not second.weight.grad.any()  # as Horovod
    if momentum:
        assert len(opt.state) == 4 and all("momentum_buffer" in s for s in opt.state.values())


def test_sparse_adam_state_is_made_from_sparse_zero_gradients() -> None:
    emb = torch.nn.Embedding(5, 2, sparse=True)
    opt = commsched.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters())))
    commsched.broadcast_optimizer_state(opt, root_rank=0)
    assert set(opt.state[emb.weight]) == {"step", "exp_avg", "exp_avg_sq"}


def test_parameter_names_are_horovods_map() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    named = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
    assert named._parameter_names == {p: n for n, p in model.named_parameters()}
    unnamed = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    names = unnamed._parameter_names
    assert set(names) == set(model.parameters()) and len(set(names.values())) == 4
