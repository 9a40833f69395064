"""Checkpoint and resume: a run saved at step K (model and wrapped optimizer state, whose
``commsched`` entry holds the plan) and resumed in a new job continues bit-identically to the
same run going on uninterrupted, for a synchronous and an overlap policy on two ranks and for
three ranks, where fusion boundaries change float sums: the resumed job must run the saved plan
from its first step (no profiling steps, no re-plan), not whatever fresh timings would give."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

K, M = 4, 4
PROFILE_STEPS = 2


def _model() -> nn.Module:
    torch.manual_seed(8)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 2))


def _train(policy: str, path: str, resume: bool) -> dict:
    """Uninterrupted: steps 0..K+M, saving at K. Resumed: loads, then steps K..K+M."""
    import commsched

    rank = commsched.init().rank
    model = _model()
    base = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = commsched.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                         model=model, policy=policy, profile_steps=PROFILE_STEPS)
    out: dict = {"plans": []}
    if resume:
        state = torch.load(path.format(rank=rank), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        out["saved"] = state["optimizer"]["commsched"]["plan"]["fingerprint"]
    for step in range(K if resume else 0, K + M):
        if step == K and not resume:
            # The model first, as loops do: its state_dict() applies the pending overlap update
            # (Note [The last deferred update] in runtime/modes/overlap/runner.py).
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            torch.save(state, path.format(rank=rank))
            out["saved"] = state["optimizer"]["commsched"]["plan"]["fingerprint"]
        gen = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(8, 10, generator=gen)),
                               torch.randn(8, 2, generator=gen)).backward()
        out["plans"].append((opt.plan.policy, opt.plan.fingerprint))  # the plan this step ran
        opt.step()
    opt.flush()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    return out


@pytest.mark.parametrize(("policy", "ranks"),
                         [("horovod", 2), ("bytescheduler", 2), ("prophet", 3)])
def test_resumed_run_is_bit_identical(policy: str, ranks: int, tmp_path) -> None:
    path = str(tmp_path / "ckpt.rank{rank}.pt")
    whole = distributed_test(_train, ranks, timeout=120, args=(policy, path, False))
    resumed = distributed_test(_train, ranks, timeout=120, args=(policy, path, True))
    for rank in range(ranks):
        saved = whole[rank]["saved"]
        assert whole[rank]["plans"][K] == (policy, saved)
        assert resumed[rank]["saved"] == saved
        assert resumed[rank]["plans"] == [(policy, saved)] * M, "the resumed run re-profiled"
        for a, b in zip(whole[rank]["params"], resumed[rank]["params"], strict=True):
            assert torch.equal(a, b), (policy, rank, float((a - b).abs().max()))


def _broadcast_resume() -> dict:
    """Horovod's idioms: broadcast_optimizer_state right after wrapping (the other ranks load
    rank 0's entry, which changes nothing), and a resume where rank 0 alone loads the checkpoint
    and broadcasts it (loading starts no collective; the ranks compare what they restored at the
    next step)."""
    import commsched

    rank = commsched.init().rank
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="prophet", profile_steps=PROFILE_STEPS)
    commsched.broadcast_optimizer_state(opt, root_rank=0)

    def steps(count: int) -> None:
        for _ in range(count):
            opt.zero_grad()
            model(torch.randn(8, 10)).square().mean().backward()
            opt.step()

    steps(K)
    saved = opt.state_dict()
    steps(2)
    if rank == 0:
        opt.load_state_dict(saved)
    commsched.broadcast_optimizer_state(opt, root_rank=0)
    restored = (opt.session.state.iteration, opt.plan.fingerprint)
    steps(2)
    return {"restored": restored, "saved": saved["commsched"]["plan"]["fingerprint"],
            "iteration": opt.session.state.iteration}


def test_rank0_load_then_broadcast_restores_every_rank() -> None:
    for out in distributed_test(_broadcast_resume, 2, timeout=90).values():
        assert out["restored"] == (K, out["saved"]) and out["iteration"] == K + 2, out


def _last_update(steps: int) -> dict:
    """The same training under horovod and under dear, the latter ended by shutdown() alone."""
    import commsched

    rank = commsched.init().rank
    out: dict = {}
    for policy in ("horovod", "dear"):
        model = _model()
        opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                             named_parameters=model.named_parameters(),
                                             model=model, policy=policy,
                                             profile_steps=PROFILE_STEPS)
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * step + rank)
            opt.zero_grad()
            nn.functional.mse_loss(model(torch.randn(8, 10, generator=gen)),
                                   torch.randn(8, 2, generator=gen)).backward()
            opt.step()
        out[f"{policy} before"] = [p.detach().clone() for p in model.parameters()]
        if policy == "horovod":
            opt.session.close()
    commsched.shutdown()
    out["dear after shutdown"] = [p.detach().clone() for p in model.parameters()]
    return out


def test_shutdown_applies_the_update_an_overlap_plan_still_defers() -> None:
    # Note [The last deferred update]: a loop that stops after its last step() and shuts down
    # has the parameters of that step, not those of the one before.
    results = distributed_test(_last_update, 2, timeout=120, args=(PROFILE_STEPS + 14,))
    for rank, out in results.items():
        synchronous = out["horovod before"]
        pending = out["dear before"]
        assert not all(torch.equal(a, b) for a, b in zip(pending, synchronous, strict=True))
        for a, b in zip(out["dear after shutdown"], synchronous, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-6), (rank, float((a - b).abs().max()))
