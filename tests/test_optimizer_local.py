"""Horovod's semantics and errors, in a world of one (no network, the same engine)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers import step_alike
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer as Wrapped


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def wrap(model: nn.Module, **kw: Any) -> Wrapped:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kw.setdefault("named_parameters", model.named_parameters())
    return commsched.DistributedOptimizer(opt, **kw)


def backward(model: nn.Module) -> None:
    model(torch.randn(5, 3)).square().sum().backward()


def test_lone_process_world() -> None:
    commsched.init()
    assert commsched.size() == 1 and commsched.rank() == 0 and commsched.local_rank() == 0


def test_asking_for_the_world_after_shutdown_says_it_was_shut_down() -> None:
    commsched.init()
    commsched.shutdown()
    with pytest.raises(RuntimeError, match=r"was shut down \(commsched.shutdown\(\)\)"):
        commsched.rank()
    commsched.init()
    assert commsched.rank() == 0


def test_wrapped_is_still_the_users_optimizer_class(model) -> None:
    opt = wrap(model)
    assert isinstance(opt, torch.optim.SGD)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    backward(model)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert set(opt.state_dict()) == {"state", "param_groups", "commsched"}


def test_same_result_as_plain_optimizer(model) -> None:
    twin = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    twin.load_state_dict(model.state_dict())
    ours = wrap(model, policy="mgwfbp", profile_steps=1)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(step))
        step_alike(((model, ours), (twin, plain)), x)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert ours.plan.policy == "mgwfbp"


def test_name_errors(model) -> None:
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="must be unique. Found duplicates: 0.weight"):
        wrap(model, named_parameters=[params[0], ("0.weight", params[1][1])] + params[2:])
    with pytest.raises(ValueError, match="were not named"):
        wrap(model, named_parameters=params[:2])
    with pytest.raises(ValueError, match="sequence of tuples"):
        wrap(model, named_parameters=[p for _, p in params])


def test_argument_errors(model) -> None:
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        wrap(model, backward_passes_per_step=0)
    with pytest.raises(ValueError,
                       match="gradient_predivide_factor not supported with op != Average"):
        wrap(model, op=commsched.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups should be a non-negative integer"):
        wrap(model, groups="two")
    with pytest.raises(commsched.ConfigError, match="argument policy='best'"):
        wrap(model, policy="best")


def test_too_many_backward_passes(model) -> None:
    opt = wrap(model, backward_passes_per_step=2)
    backward(model)
    backward(model)
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        backward(model)
    opt.synchronize()


def test_zero_grad_with_pending_work_is_an_error(model) -> None:
    opt = wrap(model)
    backward(model)
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_step_after_synchronize_warns_unless_skipped(model) -> None:
    opt = wrap(model)
    backward(model)
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    opt.zero_grad()
    backward(model)
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()


def test_missing_gradients_become_zeros(model) -> None:
    opt = wrap(model)
    opt.synchronize()  # nothing computed: every gradient is reduced as zeros, as in Horovod
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0
               for p in model.parameters())


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_are_reduced_dense_and_handed_back_sparse(sparse_as_dense: bool) -> None:
    # As Horovod's sparse_as_dense: "convert back to sparse before applying the update"; without
    # model= commsched cannot know the parameter is sparse before training, so False does too.
    emb = nn.Embedding(10, 3, sparse=True)
    opt = commsched.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                         named_parameters=emb.named_parameters(),
                                         sparse_as_dense=sparse_as_dense)
    before = emb.weight.detach().clone()
    emb(torch.tensor([1, 2])).sum().backward()
    opt.step()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse
    changed = (emb.weight != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [1, 2]


def test_scheduler_made_before_wrapping_still_goes_through_commsched(model) -> None:
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)  # patches base.step
    opt = commsched.DistributedOptimizer(base, named_parameters=model.named_parameters())
    backward(model)
    opt.step()
    # our step ran (and synchronized), not the patched original
    assert opt.session.state.iteration == 1
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        sched.step()  # the scheduler watches the original's step, as with Horovod
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_overlap_policies_need_the_model_and_refuse_lbfgs(model) -> None:
    with pytest.raises(ValueError, match="needs the model"):
        wrap(model, policy="dear")
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match="LBFGS needs all gradients at once.*policy='horovod'"):
        commsched.DistributedOptimizer(lbfgs, named_parameters=model.named_parameters(),
                                       policy="bytescheduler", model=model)


@pytest.mark.parametrize("policy", ["horovod", "mgwfbp", "bytescheduler", "dear", "auto"])
def test_step_hooks_run_once_per_step(policy: str) -> None:
    """torch wraps both the wrapper's step() and the user's class's step() in its hook-running
    function; the inner one must be skipped, or an EMA post-hook would run twice per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=2)
    calls: list[str] = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    for _ in range(6):  # profiling steps, then the policy's plan
        opt.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
    assert calls == ["pre", "post"] * 6
    opt.session.close()


def _deferring(model: nn.Module, cls: type[torch.optim.SGD]) -> Wrapped:
    """A wrapper whose overlap plan runs (dear, past its profiling and re-plan)."""
    opt = commsched.DistributedOptimizer(cls(model.parameters(), lr=0.1), model=model,
                                         named_parameters=model.named_parameters(),
                                         policy="dear", profile_steps=1)
    for _ in range(8):
        opt.zero_grad()
        backward(model)
        opt.step()
    assert opt.session.mode.defers_updates
    return opt


def test_zero_grad_after_a_deferred_step_skips_only_what_would_change_nothing(
        model, monkeypatch) -> None:
    """Note [zero_grad after a deferred step]: step() took every gradient, so torch's zero_grad
    is not called; a gradient set after step() is still cleared, and an optimizer class with a
    zero_grad of its own always has it called."""
    opt = _deferring(model, torch.optim.SGD)
    calls: list[bool] = []
    torch_zero_grad = torch.optim.Optimizer.zero_grad

    def counted(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        calls.append(set_to_none)
        torch_zero_grad(self, set_to_none)
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", counted)
    backward(model)
    opt.step()
    opt.zero_grad()
    assert calls == [] and all(p.grad is None for p in model.parameters())
    first = next(model.parameters())
    first.grad = torch.ones_like(first)
    opt.zero_grad(set_to_none=False)
    assert calls == [False] and torch.equal(first.grad, torch.zeros_like(first))
    first.grad = None
    backward(model)  # the first gradient applies what is left
    opt.step()
    opt.flush()
    opt.session.close()

    class OwnZeroGrad(torch.optim.SGD):
        zeroed = 0

        def zero_grad(self, set_to_none: bool = True) -> None:
            OwnZeroGrad.zeroed += 1
            super().zero_grad(set_to_none)
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = _deferring(other, OwnZeroGrad)
    before = OwnZeroGrad.zeroed
    backward(other)
    opt.step()
    opt.zero_grad()
    assert OwnZeroGrad.zeroed == before + 1
    opt.flush()
    opt.session.close()


def test_the_hyper_parameter_snapshot_follows_a_replaced_key(model) -> None:
    """The identity check at step() reads the snapshot's keys: a key replaced by another (same
    count) must be seen, not read as the old key's missing value."""
    from commsched.runtime.deferred import HyperParameterSnapshots
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    snapshots = HyperParameterSnapshots(opt)
    taken = snapshots.groups
    snapshots.take()
    assert snapshots.groups is taken  # nothing changed: not taken again
    group = opt.param_groups[0]
    del group["dampening"]
    group["custom"] = 0
    snapshots.take()
    assert "custom" in snapshots.groups[0] and "dampening" not in snapshots.groups[0]
    group["lr"] = 0.05
    snapshots.take()
    assert snapshots.groups[0]["lr"] == 0.05
