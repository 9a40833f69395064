"""PowerSGD and top-k on 2 and 3 Gloo ranks, synchronous and overlap policies: every rank ends
with the same parameters, equal (to float tolerance: the engine's sums run in another order) to
a single-process simulation of the same compressed averaging built from commsched.compression's
pure functions, applied synchronously. The runs use SGD with momentum, so top-k runs with DGC's
momentum correction (Note [DGC under the user's momentum],
commsched/runtime/compression/dgc_momentum.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test
from test_dgc_dist import check_least_squares, train_least_squares
from torch import nn

from commsched.compression import PowerSGD, TopK
from commsched.compression_math import initial_q, matrix_shape, simulate_dgc, simulate_powersgd

pytestmark = pytest.mark.processes

STEPS = 4
MOMENTUM = 0.5


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))


def _loss(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(100 * step + rank))
    return model(x).square().mean()


def _simulate(world: int, lossy: PowerSGD | TopK, op: str = "average") -> list[torch.Tensor]:
    scale = 1.0 if op == "sum" else 1.0 / world
    model = _model()
    params = list(model.parameters())
    compressed = [i for i, p in enumerate(params) if lossy.compresses(p.shape)]
    # Top-k's compressed tensors: DGC's exchanged sum is the update, stepped without momentum.
    dgc = [p for i, p in enumerate(params) if isinstance(lossy, TopK) and i in compressed]
    rest = [p for p in params if all(p is not q for q in dgc)]
    optimizers = [torch.optim.SGD(rest, lr=0.1, momentum=MOMENTUM)] if rest else []
    optimizers += [torch.optim.SGD(dgc, lr=0.1)] if dgc else []
    residuals = {i: [torch.zeros(matrix_shape(params[i].shape) if params[i].dim() > 1
                                 else params[i].shape) for _ in range(world)]
                 for i in compressed}
    velocities = {i: [torch.zeros_like(e) for e in residuals[i]] for i in compressed}
    qs = {i: initial_q(matrix_shape(params[i].shape)[1],
                       lossy.rank_for(params[i].shape), seed=n, dtype=torch.float32)
          for n, i in enumerate(compressed) if isinstance(lossy, PowerSGD)}
    for step in range(STEPS):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            _loss(model, step, rank).backward()
            per_rank.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                             for p in params])
        for i, p in enumerate(params):
            grads = [g[i] for g in per_rank]
            if i not in compressed or step < lossy.start_step:
                p.grad = torch.stack(grads).sum(0) * scale
            elif isinstance(lossy, PowerSGD):
                mats = [g.reshape(residuals[i][0].shape) for g in grads]
                approx, residuals[i], qs[i] = simulate_powersgd(mats, residuals[i], qs[i],
                                                                scale)
                p.grad = approx.reshape(p.shape)
            else:
                share = [s for first, s in lossy.stages() if first <= step][-1]
                average, velocities[i], residuals[i] = simulate_dgc(
                    grads, velocities[i], residuals[i], lossy.k(p.numel(), share), MOMENTUM,
                    scale=scale)
                p.grad = average.reshape(p.shape)
        for opt in optimizers:
            opt.step()
    return [p.detach() for p in params]


def _train(lossy: Any, policy: str, op: str) -> list[torch.Tensor]:
    import commsched

    options: dict[str, dict[str, Any]] = {"sum": {"op": commsched.Sum},
                                          "predivide": {"gradient_predivide_factor": 2.0}}
    scaling = options.get(op, {})
    commsched.init()
    rank = commsched.rank()
    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM),
        named_parameters=model.named_parameters(), compression=lossy, policy=policy,
        profile_steps=2, model=model, **scaling)
    for step in range(STEPS):
        opt.zero_grad()
        _loss(model, step, rank).backward()
        opt.step()
    assert "+" + lossy.label in opt.plan.policy, opt.plan.policy
    if policy in ("bytescheduler", "prophet", "dear"):
        assert opt.session.mode.defers_updates, "the overlap plan did not run"
    opt.flush()  # an overlap plan's last updates wait for the next forward pass
    return [p.detach().clone() for p in model.parameters()]


CASES: list[tuple[int, PowerSGD | TopK, str, str]] = [
    (2, PowerSGD(rank=2, min_ratio=1.0), "horovod", "average"),
    (3, PowerSGD(rank=2, min_ratio=1.0, start_step=2), "ddp", "predivide"),
    (3, TopK(ratio=0.1), "horovod", "predivide"),
    # The overlap policies rebuild the gradients in the next forward (compression starting
    # while an overlap plan runs, for DeAR), and `auto` chooses among compressed plans.
    (2, PowerSGD(rank=2, min_ratio=1.0), "bytescheduler", "average"),
    (3, PowerSGD(rank=2, min_ratio=1.0, start_step=3), "dear", "predivide"),
    (2, TopK(ratio=0.1), "prophet", "sum"),
    (3, TopK(ratio=0.1, warmup_steps=2), "dear", "average"),  # 25% sent, then 10%
    (2, PowerSGD(rank=1, min_ratio=1.0), "auto", "average")]


def _check(results: dict[int, list[torch.Tensor]], world: int, lossy: PowerSGD | TopK,
           op: str) -> None:
    for rank in range(1, world):
        for a, b in zip(results[0], results[rank], strict=True):
            assert torch.equal(a, b), f"rank {rank} differs from rank 0"
    expected = _simulate(world, lossy, op)
    for ours, want in zip(results[0], expected, strict=True):
        torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)
    # Lossy indeed: the uncompressed average would give other parameters.
    plain = _simulate(world, PowerSGD(rank=2, min_ratio=1.0, start_step=STEPS), op)
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(expected, plain, strict=True))


@pytest.mark.parametrize(("world", "lossy", "policy", "op"), CASES,
                         ids=[f"{w}ranks-{c.label}-{p}-{o}" for w, c, p, o in CASES])
def test_compressed_training_matches_simulation(world: int, lossy: PowerSGD | TopK,
                                                policy: str, op: str) -> None:
    results = distributed_test(_train, world_size=world, timeout=120, args=(lossy, policy, op))
    _check(results, world, lossy, op)


def _train_then_least_squares(lossy: Any, policy: str, op: str
                              ) -> tuple[list[torch.Tensor], float]:
    return _train(lossy, policy, op), train_least_squares()


def test_topk_on_two_ranks_and_under_momentum() -> None:
    """The 2-rank top-k case, then, in the same job, the least-squares task of
    test_dgc_dist.py (top-k trains under momentum 0.9 within 2x of uncompressed)."""
    lossy = TopK(ratio=0.1)
    results = distributed_test(_train_then_least_squares, world_size=2, timeout=120,
                               args=(lossy, "mgwfbp", "sum"))
    _check({r: params for r, (params, _) in results.items()}, 2, lossy, "sum")
    check_least_squares([loss for _, loss in results.values()])


def _mismatched_compression() -> str:
    import commsched

    commsched.init()
    rank = commsched.rank()
    model = _model()
    try:
        commsched.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
            compression=commsched.Compression.powersgd(rank=1 + rank, min_ratio=1))
    except commsched.MismatchError as err:
        return str(err)
    return "no error"


def test_ranks_with_other_compression_settings_refuse_to_start() -> None:
    results = distributed_test(_mismatched_compression, world_size=2, timeout=90)
    for text in results.values():
        assert "settings" in text and "PowerSGD(rank=2" in text, text
