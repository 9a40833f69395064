"""Sparse gradients in a world of one: routed by model=, or without it reduced dense and handed
back sparse. Across ranks: tests/runtime/intake/test_sparse_dist.py and the Horovod parity
job tests/jobs/edge_cases_job.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import commsched


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradient_without_model_is_reduced_dense_and_handed_back_sparse(
        sparse_as_dense: bool) -> None:
    """Horovod's signature has no model=: the gradient is reduced dense and the optimizer gets
    it sparse again, so SparseAdam works (Horovod's test_sparse_embeddings, with both values)."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 3, sparse=True)
    twin = nn.Embedding(10, 3, sparse=True)
    twin.load_state_dict(emb.state_dict())
    opt = commsched.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                         sparse_as_dense=sparse_as_dense)
    plain = torch.optim.SparseAdam(list(twin.parameters()), lr=0.1)
    for m, o in ((emb, opt), (twin, plain)):
        o.zero_grad()
        m(torch.tensor([[1, 2, 4], [4, 3, 9]])).sum().backward()
        o.step()
        grad = m.weight.grad
        assert isinstance(grad, torch.Tensor) and grad.is_sparse
    assert torch.equal(emb.weight, twin.weight)


@pytest.mark.parametrize("policy", ["horovod", "dear"])
def test_sparse_parameters_of_the_model_bypass_the_dense_plan(policy: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 2))
    twin = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 2))
    twin.load_state_dict(model.state_dict())
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=1)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1)
    assert [s.name for s in opt.session.specs] == ["1.weight", "1.bias"]
    for step in range(3):
        tokens = torch.randint(0, 10, (4, 2), generator=torch.Generator().manual_seed(step))
        for m, o in ((model, opt), (twin, plain)):
            o.zero_grad()
            m(tokens).square().sum().backward()
            grad = m[0].weight.grad
            assert isinstance(grad, torch.Tensor) and grad.is_sparse
            o.step()
    opt.flush()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
