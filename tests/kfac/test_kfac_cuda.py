"""K-FAC on CUDA: the preconditioner trains a CUDA model through commsched (world of one) exactly
as it does without the wrapper, and the loss goes down."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.gpu

STEPS = 10


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.ReLU(),
                         nn.Linear(32, 5)).cuda()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step % 3)  # a few batches, seen again: the loss falls
    return (torch.randn(32, 3, 8, 8, generator=gen).cuda(),
            torch.randint(0, 5, (32,), generator=gen).cuda())


def _train(wrapped: bool) -> tuple[list[torch.Tensor], list[float]]:
    import commsched
    from commsched.kfac import KFACPreconditioner

    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapper = (commsched.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                              policy="horovod") if wrapped else None)
    opt = base if wrapper is None else wrapper
    precond = KFACPreconditioner(model, inv_update_steps=2, damping=0.01, profile_steps=2)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss))
        if wrapper is not None:
            wrapper.synchronize()
            precond.step()
            with wrapper.skip_synchronize():
                wrapper.step()
        else:
            precond.step()
            opt.step()
    precond.shutdown()
    torch.cuda.synchronize()
    return [p.detach().clone() for p in model.parameters()], losses


def test_kfac_trains_on_cuda_as_without_the_wrapper() -> None:
    import commsched

    commsched.init()
    ours, losses = _train(wrapped=True)
    reference, _ = _train(wrapped=False)
    assert all(p.is_cuda for p in ours)
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(p).all() for p in ours)
    assert losses[-1] < losses[0], losses
