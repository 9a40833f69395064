"""Sparse gradients without sparse_as_dense in a world of one: routed by model=, refused with both
remedies named without it. Across ranks: tests/dist/test_sparse_dist.py and the Horovod parity
job tests/e2e/edge_cases_job.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import commsched


def test_sparse_gradient_without_model_names_both_remedies() -> None:
    emb = nn.Embedding(10, 3, sparse=True)
    commsched.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters())
    with pytest.raises(ValueError, match="'weight' has a sparse gradient.*sparse_as_dense=True.*"
                                         "model=model"):
        emb(torch.tensor([1, 2])).sum().backward()


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
