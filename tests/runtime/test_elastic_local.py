"""Elastic Horovod's protocol as a wrapped optimizer sees it, in a world of one with
HOROVOD_ELASTIC=1 (the multi-worker run is tests/runtime/test_elastic_horovodrun.py): the session
binds at its first step, a failure raises Horovod's HorovodInternalError, TorchState's
save / restore / sync calls work on an unbound or broken session, and the next step re-forms the
world and plans again from the restored iteration."""

from __future__ import annotations

import pytest
import torch
from horovod.common.exceptions import HorovodInternalError
from torch import nn

import commsched
from commsched.optimizer import _DistributedOptimizer as Wrapped
from commsched.world import bootstrap
from commsched.world.errors import failure_type


@pytest.fixture
def elastic_world(monkeypatch):
    commsched.shutdown()  # a world formed by an earlier test was not elastic
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    yield
    commsched.shutdown()


def _setup(policy: str = "mgwfbp") -> tuple[nn.Module, Wrapped]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), policy=policy, profile_steps=2)
    return model, opt


def _step(model: nn.Module, opt: torch.optim.Optimizer, features: int = 3) -> None:
    opt.zero_grad()
    model(torch.randn(5, features)).square().sum().backward()
    opt.step()


def test_failure_is_horovods_internal_error(elastic_world) -> None:
    assert issubclass(failure_type(), HorovodInternalError)
    assert issubclass(failure_type(), commsched.RankFailureError)


def test_session_binds_at_first_step_and_reforms_after_a_failure(elastic_world) -> None:
    model, opt = _setup()
    session = opt.session
    # At wrap: no world, no plan; TorchState's save works and carries no commsched entry.
    assert not bootstrap.is_initialized() and not session.bound
    assert "commsched" not in opt.state_dict()
    with pytest.raises(RuntimeError, match="made at the first step"):
        _ = opt.plan
    with pytest.raises(RuntimeError, match="made at the first step"):
        _ = opt.auto
    assert opt.plan_settled is False
    # Horovod's broadcast_optimizer_state on a fresh optimizer: step() on zero gradients, local.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert len(opt.state) == 4 and not session.bound and not bootstrap.is_initialized()

    _step(model, opt)
    first = bootstrap.world()
    assert session.bound and session.state.iteration == 1 and session.lifecycle.replan_at == 2
    committed = opt.state_dict()
    assert committed["commsched"]["iteration"] == 1
    _step(model, opt)
    _step(model, opt)
    assert session.state.iteration == 3 and session.plan.policy == "mgwfbp"

    # A collective fails (as a dead peer makes it): the world is broken, the step is abandoned.
    error = first.fail("peer gone")
    assert isinstance(error, HorovodInternalError) and session.binding.stale
    # hvd.elastic.run's restore: the last commit's position, no engine touched.
    opt.load_state_dict(committed)
    assert session.state.iteration == 1
    _step(model, opt)
    assert bootstrap.world() is not first and bootstrap.world().generation == first.generation + 1
    # Profiled afresh for the re-formed world: the profiling plan until iteration 1 + 2.
    assert session.state.iteration == 2 and session.lifecycle.replan_at == 3
    assert session.plan.policy != "mgwfbp"
    _step(model, opt)
    assert session.plan.policy == "mgwfbp"


def _fail_a_step(model: nn.Module, opt: Wrapped, monkeypatch, wait: str,
                 features: int = 3) -> None:
    """One iteration whose engine `wait` (a method name) fails as a dead peer makes it fail."""
    world = bootstrap.world()

    def failed(*args: object) -> None:
        raise world.fail("collective of block 0 failed: Connection reset by peer")

    monkeypatch.setattr(opt.session.engine, wait, failed)
    opt.zero_grad()
    model(torch.randn(5, features)).square().sum().backward()
    with pytest.raises(HorovodInternalError, match="Connection reset"):
        opt.step()
    # The restored run starts with zero_grad(): nothing of the failed iteration is pending.
    assert not opt.session.accumulation.pending


def test_a_worker_restores_before_its_first_step(elastic_world) -> None:
    """A worker added to the job restores its TorchState (a failure elsewhere before it ever
    stepped): load_state_dict() on a session never bound, then the job goes on."""
    model, opt = _setup()
    opt.load_state_dict(opt.state_dict())
    assert not opt.session.bound
    _step(model, opt)
    assert opt.session.bound and opt.session.state.iteration == 1
    opt.session.close()


def test_a_failed_step_forgets_its_gradients(elastic_world, monkeypatch) -> None:
    model, opt = _setup()
    _step(model, opt)
    first = bootstrap.world()
    _fail_a_step(model, opt, monkeypatch, "wait")
    _step(model, opt)
    assert opt.session.state.iteration == 2 and bootstrap.world().generation == first.generation + 1


def test_a_restore_drops_what_an_overlap_plan_defers(elastic_world) -> None:
    # Note [Elastic Horovod and deferred updates]: a commit applies the deferred update, and a
    # restore (load_state_dict) drops what is deferred since, with the runner and the engine,
    # without waiting for anything; the next step binds again with a new runner.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="dear", profile_steps=1)
    for _ in range(3):
        _step(model, opt)
    runner = opt.session.modes.runner
    assert runner is not None and runner.active and runner.open  # an update is deferred
    saved = {k: v.clone() for k, v in model.state_dict().items()}  # applies it (the commit)
    assert not runner.open
    committed = opt.state_dict()
    _step(model, opt)
    assert runner.open
    model.load_state_dict(saved)
    opt.load_state_dict(committed)
    assert not opt.session.bound and opt.session.modes.runner is None and not runner.open
    # No hook of the old runner is left: a forward pass applies nothing.
    model(torch.randn(2, 3))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    _step(model, opt)
    assert opt.session.bound and opt.session.modes.runner is not None
    assert opt.session.modes.runner is not runner


def test_kfac_binds_at_first_use_and_restores_its_commit(elastic_world) -> None:
    # Note [Elastic K-FAC]: Horovod's TorchState saves, restores and syncs the preconditioner;
    # a restore drops its exchanges, and the next use binds to the world of now.
    from horovod.torch.elastic.state import get_handler_registry

    from commsched.kfac import KFACPreconditioner

    model, opt = _setup()
    precond = KFACPreconditioner(model, inv_update_steps=1)
    assert precond.bound is None  # no world before the first step
    # The handler TorchState(..., kfac=precond) takes (its sync needs Horovod initialised).
    state = next(handler(precond) for cls, handler in get_handler_registry()
                 if isinstance(precond, cls))

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()
        opt.synchronize()
        precond.step()
        with opt.skip_synchronize():
            opt.step()

    step()
    first = precond.bound
    assert first is not None and precond.steps == 1
    state.save()  # a commit
    committed = {name: lay.a.clone() for name, lay in
                 ((lay.name, lay) for lay in precond.layers) if lay.a is not None}
    step()
    assert precond.steps == 2
    assert any(not torch.equal(lay.a, committed[lay.name]) for lay in precond.layers
               if lay.a is not None)
    bootstrap.world().fail("peer gone")
    state.restore()  # hvd.elastic.run after a failure
    assert precond.bound is None and precond.steps == 1
    assert all(torch.equal(lay.a, committed[lay.name]) for lay in precond.layers
               if lay.a is not None)
    step()
    assert precond.bound is not None and precond.bound is not first and precond.steps == 2
    assert precond.bound.world is bootstrap.world()
    precond.shutdown()


def test_sharding_is_refused_in_an_elastic_job(elastic_world) -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="shard_optimizer=True .* elastic Horovod job"):
        commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       shard_optimizer=True)


@pytest.mark.parametrize("lossy", ["powersgd", "topk"])
def test_a_compressor_starts_afresh_at_each_bind(elastic_world, lossy: str) -> None:
    # Note [Elastic Horovod and compressor state]: each bind makes a new compressor, with top-k's
    # momentum correction attached (DGC under momentum SGD) and nothing left over.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    compression = commsched.Compression.powersgd(rank=1) if lossy == "powersgd" \
        else commsched.Compression.topk(ratio=0.1)
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=compression, profile_steps=1)
    assert opt.session.compressed is None  # no world before the first step

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(5, 8)).square().sum().backward()
        opt.step()

    step()
    committed = opt.state_dict()
    step()
    first = opt.session.compressed
    assert first is not None and first.on and opt.session.binding.binds == 1
    assert (first.correction is not None) == (lossy == "topk")
    # A world of one sends everything it can; what stays behind is the rest of M: not zero.
    assert any(float(e.abs().sum()) > 0 for e in first.residuals)
    bootstrap.world().fail("peer gone")
    opt.load_state_dict(committed)
    assert opt.session.state.iteration == 1
    step()
    second = opt.session.compressed
    assert second is not None and second is not first and opt.session.binding.binds == 2
    assert (second.correction is not None) == (lossy == "topk")
    assert second.on and opt.session.state.iteration == 2


def test_a_failed_second_round_under_an_overlap_plan_forgets_its_gradients(
        elastic_world, monkeypatch) -> None:
    # PowerSGD under dear waits for its P blocks inside step(): a lost peer fails it there, and
    # the restored run's zero_grad() must find nothing pending (found by scripts/chaos.sh).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        model=model, policy="dear", profile_steps=1,
        compression=commsched.Compression.powersgd(rank=1))
    for _ in range(3):
        _step(model, opt, 8)
    first = bootstrap.world()
    committed = opt.state_dict()
    _fail_a_step(model, opt, monkeypatch, "wait_block", features=8)  # a P block's wait
    opt.load_state_dict(committed)  # hvd.elastic.run's restore
    _step(model, opt, 8)
    assert bootstrap.world().generation == first.generation + 1
