"""Distributed K-FAC on Gloo ranks: 2 and 3 ranks, each with a slice of the batch, give the same
parameters as one process training on the concatenated batch; the placement is identical on
every rank and the factor plan is re-built by the mgwfbp rule after the profiling updates."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

STEPS, PER_RANK = 6, 4


def _model() -> nn.Module:
    torch.manual_seed(21)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, bias=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 24), nn.ReLU(), nn.Linear(24, 5)).double()


def _batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(size, 3, 8, 8, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 5, (size,), generator=gen)


KWARGS: dict[str, dict[str, Any]] = {
    "pipelined-lpt-eigen": {"compute_method": "eigen", "placement": "lpt", "symmetric": False},
    "unpipelined-rr-inverse": {"compute_method": "inverse", "placement": "round_robin",
                               "pipelined": False},
}


def _train(variant: str, world: int, rank: int, distributed: bool) -> dict:
    import commsched
    from commsched.kfac import KFACPreconditioner

    torch.set_num_threads(1)
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    wrapped = (commsched.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                              policy="horovod") if distributed else None)
    opt = base if wrapped is None else wrapped
    precond = KFACPreconditioner(model, inv_update_steps=2, damping=0.01, local_threshold=12,
                                 profile_steps=2, **KWARGS[variant])
    for step in range(STEPS):
        x, y = _batch(step, PER_RANK * world)
        if distributed:
            mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            x, y = x[mine], y[mine]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if wrapped is not None:
            wrapped.synchronize()
            precond.step()
            with wrapped.skip_synchronize():
                wrapped.step()
        else:
            precond.step()
            opt.step()
    assert precond.bound is not None
    plan = precond.bound.factors.plan
    out = {"params": [p.detach().clone() for p in model.parameters()],
           "assignment": precond.assignment.describe(), "owner": dict(precond.assignment.owner),
           "factor_plan": None if plan is None else (plan.policy, plan.fingerprint)}
    precond.shutdown()
    return out


def _rank(variant: str, world: int) -> dict:
    import commsched
    return _train(variant, world, commsched.init().rank, True)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_match_one_process_on_the_concatenated_batch(world: int) -> None:
    for variant in KWARGS:
        reference = _train(variant, world, 0, False)["params"]
        results = distributed_test(_rank, world, timeout=120, args=(variant, world))
        for rank in range(world):
            for got, want in zip(results[rank]["params"], reference, strict=True):
                assert torch.allclose(got, want, rtol=1e-7, atol=1e-9), \
                    (variant, rank, float((got - want).abs().max()))
        assert len({results[r]["assignment"] for r in range(world)}) == 1
        owners = set(results[0]["owner"].values())
        assert -1 in owners and len(owners - {-1}) == world  # some local, every rank owns some
        plans = {results[r]["factor_plan"] for r in range(world)}
        assert len(plans) == 1 and next(iter(plans))[0] == "mgwfbp"


K_SAVE, M_MORE = 5, 4


def _checkpointed(world: int, steps: range, load: str = "", save: str = "") -> dict:
    """Rank's part of a K-FAC run that may start from and end with a checkpoint (model, wrapped
    optimizer, K-FAC state with its factor plan)."""
    import commsched
    from commsched.kfac import KFACPreconditioner

    torch.set_num_threads(1)
    rank = commsched.init().rank
    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), policy="mgwfbp", profile_steps=2)
    precond = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=3, damping=0.01,
                                 local_threshold=12, profile_steps=1)
    if load:
        state = torch.load(load.format(rank=rank), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        precond.load_state_dict(state["kfac"])
    for step in steps:
        x, y = _batch(step, PER_RANK * world)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[rank::world]), y[rank::world]).backward()
        opt.synchronize()
        precond.step()
        with opt.skip_synchronize():
            opt.step()
    if save:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "kfac": precond.state_dict()}, save.format(rank=rank))
    assert precond.bound is not None
    plan = precond.bound.factors.plan
    out = {"params": [p.detach().clone() for p in model.parameters()],
           "factor_plan": None if plan is None else plan.fingerprint,
           "factor_updates": precond.bound.factors.updates}
    precond.shutdown()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_kfac_checkpoint_resumes_bit_identically(world: int, tmp_path) -> None:
    """Plans come from measured timings, so two jobs may fuse differently; with 3 ranks that
    changes float sums, so there a large alpha makes every job fuse everything into one block and
    the uninterrupted run comparable bit for bit. With 2 ranks the plans are timing-derived and
    the resumed job must run the saved one."""
    path = str(tmp_path / "kfac.rank{rank}.pt")
    env = {"COMMSCHED_ALPHA": "1"} if world == 3 else {}
    whole = distributed_test(_checkpointed, world, timeout=120, env=env,
                             args=(world, range(K_SAVE + M_MORE)))
    first = distributed_test(_checkpointed, world, timeout=120, env=env,
                             args=(world, range(K_SAVE), "", path))
    resumed = distributed_test(_checkpointed, world, timeout=120, env=env,
                               args=(world, range(K_SAVE, K_SAVE + M_MORE), path))
    for rank in range(world):
        assert resumed[rank]["factor_plan"] == first[rank]["factor_plan"]  # restored, not re-made
        assert resumed[rank]["factor_updates"] == whole[rank]["factor_updates"]  # no re-profiling
        for a, b in zip(whole[rank]["params"], resumed[rank]["params"], strict=True):
            assert torch.equal(a, b), (world, rank, float((a - b).abs().max()))


def _skipping(decay: float) -> dict:
    """Rank 1 does not run the head at step 1 and runs no K-FAC layer at all at step 2."""
    import commsched
    from commsched.kfac import KFACPreconditioner
    from commsched.kfac import factors as fx

    rank = commsched.init().rank
    torch.manual_seed(1)
    body, head = nn.Linear(4, 5).double(), nn.Linear(5, 3).double()
    model = nn.ModuleDict({"body": body, "head": head})
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    precond = KFACPreconditioner(model, factor_decay=decay, local_threshold=0)
    expected = None
    for step in range(3):
        x = torch.randn(6, 4, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(10 * step + rank))
        opt.zero_grad()
        if step == 2 and rank == 1:
            pass  # nothing runs here; synchronize() sends zeros for every gradient
        elif step == 1 and rank == 1:
            body(x).sum().backward()
        else:
            if step == 1:  # rank 0 alone computes the head's A factor this step
                with torch.no_grad():
                    own = fx.a_factor(head, body(x))
                before = precond.layers[1].a
                assert own is not None and before is not None  # step 0 ran the head everywhere
                expected = decay * before + (1 - decay) * own
            head(body(x)).square().sum().backward()
        opt.synchronize()
        precond.step()
        if step == 1:
            after = precond.layers[1].a
            assert after is not None
            got = after.clone()
        with opt.skip_synchronize():
            opt.step()
    out = {"head_a": got, "expected": expected,
           "params": [p.detach().clone() for p in model.parameters()]}
    precond.shutdown()
    return out


def test_layers_skipped_on_some_ranks_average_over_the_ranks_that_ran_them() -> None:
    results = distributed_test(_skipping, 2, timeout=90, args=(0.6,))
    assert torch.allclose(results[0]["head_a"], results[0]["expected"], rtol=1e-12)
    assert torch.equal(results[1]["head_a"], results[0]["head_a"])
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b)
