"""Update groups in a running overlap plan (world of one): planned from the profile, hooks only
where a group starts, and the same parameters as the plain optimizer."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable

import pytest
import torch
from helpers import step_alike
from torch import nn

import commsched
from commsched.config import KNOBS_BY_KEY
from commsched.plan import NetModel, Plan, Profile, UpdateGroup
from commsched.sim.overlap import completing_blocks

REFINE_STEPS = KNOBS_BY_KEY["refine_steps"].default

# With profile_steps=2: the iteration after which the plan has settled (the profiling steps,
# then the policy's first plan until its steady-state re-plan).
SETTLED = 2 + REFINE_STEPS


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    if hasattr(opt, "flush"):
        opt.flush()


def _hooked(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if m._forward_pre_hooks}


@pytest.mark.parametrize("policy", ["bytescheduler", "prophet", "dear"])
@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
])
def test_planned_groups_update_like_the_plain_optimizer(
        policy: str, make: Callable[..., torch.optim.Optimizer]) -> None:
    model, twin = _model(), _model()
    ours = commsched.DistributedOptimizer(make(model.parameters()), model=model, policy=policy,
                                          named_parameters=model.named_parameters(),
                                          profile_steps=2)
    assert len(_hooked(model)) == len(list(model.modules()))  # profiling: every module records
    _train(model, ours, SETTLED + 2)
    _train(twin, make(twin.parameters()), SETTLED + 2)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    session = ours.session
    groups = ours.plan.update_groups
    assert session.mode.defers_updates and groups, "an overlap plan with planned update groups"
    assert sorted(t for g in groups for t in g.tensor_ids) == list(range(8))
    # Pre-hooks now only where a group starts and on the first users of its parameters (the
    # Linear layers), none on ReLU/Tanh; the leading group, which starts at the first Linear,
    # runs in the root's pre-hook (Note [The leading group runs at the root]).
    assert {g.module for g in groups} <= {"0", "2", "4", "6"} and groups[0].module == "0"
    user = {t: str(2 * (t // 2)) for t in range(8)}  # "0.weight", "0.bias" -> "0", ...
    later = {m for g in groups[1:] for m in (g.module, *(user[t] for t in g.tensor_ids))}
    assert _hooked(model) == {""} | later
    # The split update of the profiling steps timed calls of two sizes: a fitted call cost.
    compute = session.profile_document()["compute"]
    assert compute["update_fixed_s"] >= 0 and compute["update_per_byte_s"] >= 0
    profiler = session.engine.profiler  # in a world of one the split was its first step's
    assert len({n for n, _ in profiler.update_samples + profiler.first_update_samples}) >= 2
    session.close()


def test_a_costly_call_with_nothing_to_wait_for_makes_one_group() -> None:
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model=model, policy="bytescheduler",
                                         named_parameters=model.named_parameters(),
                                         profile_steps=2)
    _train(model, opt, SETTLED + 1)
    # A world of one: every block is done before the forward pass starts, so nothing is
    # gained by a second call.
    assert len(opt.plan.update_groups) == 1
    group = opt.plan.update_groups[0]
    assert group.module == "0" and group.tensor_ids == tuple(range(8))
    assert _hooked(model) == {""}  # the one group runs at the root: no other module is hooked
    opt.session.close()


class Sometimes(nn.Module):
    """`first` runs on even steps only: a group starting there is skipped on odd steps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.zeroth, self.first = nn.Linear(4, 4), nn.Linear(4, 4)
        self.second, self.third = nn.Linear(4, 4), nn.Linear(4, 2)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.zeroth(x)
        if self.step % 2 == 0:
            x = self.first(x)
        return self.third(torch.relu(self.second(x)))


def test_a_skipped_group_start_is_applied_by_the_next_module_that_needs_it() -> None:
    model, twin = Sometimes(), Sometimes()
    ours = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                          momentum=0.9),
                                          named_parameters=model.named_parameters(),
                                          model=model, policy="bytescheduler", profile_steps=2)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)

    def train(steps: range) -> None:
        for step in steps:
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
            for m, opt in ((model, ours), (twin, plain)):
                m.step = step
                opt.zero_grad()
                m(x).square().sum().backward()  # the old parameters in forward would fail here
                for p in m.parameters():  # Horovod's rule: a missing gradient counts as zeros
                    if opt is plain and p.grad is None:
                        p.grad = torch.zeros_like(p)
                opt.step()

    train(range(3))  # the profiling steps, then the planned overlap plan
    ours.flush()
    # Two groups, the second starting at `first`, which odd steps skip: `second` and `third`,
    # first users of its other parameters, must apply it then.
    plan = ours.plan
    needs = completing_blocks(plan)
    tids = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    split = [("zeroth", (tids["zeroth.weight"], tids["zeroth.bias"])),
             ("first", tuple(t for n, t in tids.items() if not n.startswith("zeroth")))]
    runner = ours.session.modes.runner
    assert runner is not None
    runner.activate(dataclasses.replace(plan, update_groups=tuple(
        UpdateGroup(module, ts, max(needs[t] for t in ts)) for module, ts in split)))
    assert _hooked(model) == {"", "first", "second", "third"}
    train(range(3, 9))
    ours.flush()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    ours.session.close()


def test_deferred_updates_advance_the_state_loaded_by_load_state_dict() -> None:
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2),
                                         named_parameters=model.named_parameters(),
                                         model=model, policy="bytescheduler", profile_steps=2)
    _train(model, opt, 4)  # the overlap plan runs: sub-optimizers are cached
    saved = copy.deepcopy(opt.state_dict())  # as from a checkpoint file: new tensors
    opt.load_state_dict(saved)  # torch makes new state and param-group dicts
    weight = model.get_parameter("0.weight")
    loaded, loaded_step = opt.state[weight]["exp_avg"].clone(), float(opt.state[weight]["step"])
    _train(model, opt, 2)
    assert not torch.equal(opt.state[weight]["exp_avg"], loaded)  # the loaded state moved on
    assert float(opt.state[weight]["step"]) == loaded_step + 2
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "dear"])
def test_a_pause_at_flush_is_not_counted_as_compute(policy: str) -> None:
    """Note [A pause is not compute]: where the loop stops after flush(), the next iteration's
    compute before its first gradient is not measured from the step() before the stop."""
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2)
    profiler = opt.session.engine.profiler
    opt.session.engine.sample_every = 1  # as in the profiling steps: every iteration recorded
    for _ in range(3):
        _train(model, opt, 2)  # ends with flush()
        time.sleep(0.3)  # an evaluation, say
    assert max(profiler.compute_samples["before_first_ready_s"]) < 0.2
    befores = [row.before_first_ready_s for row in profiler.iteration_rows()]
    assert -1.0 in befores and max(befores) < 0.2
    opt.session.close()


class SlowSGD(torch.optim.SGD):
    """SGD whose every call costs 30 ms more: an update that dwarfs the tiny model's forward."""

    SLEEP_S = 0.03

    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        time.sleep(self.SLEEP_S)
        return super().step(closure)


def test_the_profile_does_not_count_deferred_updates_as_forward_compute() -> None:
    """Under an overlap plan the updates run inside the forward pass. The profile has them in
    step_s; before_first_ready_s (forward and loss) must leave them out, or the simulator and
    the floor charge every update twice."""
    model = _model()
    opt = commsched.DistributedOptimizer(SlowSGD(model.parameters(), lr=0.1), model=model,
                                         policy="dear", named_parameters=model.named_parameters(),
                                         profile_steps=2)
    _train(model, opt, 8)
    assert opt.session.mode.defers_updates
    compute = opt.session.engine.profiler.compute_samples
    # The deferred updates are counted, once; a forward that took them in would be over the
    # sleep in every sample, so the median is compared (the other worker may hold the cores).
    assert min(compute["step_s"][-4:]) >= SlowSGD.SLEEP_S
    assert sorted(compute["before_first_ready_s"][-4:])[2] < SlowSGD.SLEEP_S
    opt.session.close()


def test_module_times_come_from_sampled_forward_passes_without_the_runners_own_work() -> None:
    """Note [Module times at steady state]: under an overlap plan, module times are recorded in
    the forward passes the profiler samples, and only there, and leave out what the runner's
    hooks spend inside them (here the 30 ms update in the root's pre-hook)."""
    from commsched.runtime.planning.lifecycle import SAMPLE_EVERY
    model = _model()
    opt = commsched.DistributedOptimizer(SlowSGD(model.parameters(), lr=0.1), model=model,
                                         policy="bytescheduler", profile_steps=2,
                                         named_parameters=model.named_parameters())
    _train(model, opt, SETTLED + SAMPLE_EVERY)
    runner = opt.session.modes.runner
    assert runner is not None and runner.active
    assert opt.plan.update_groups[0].module == "0"  # applied in the root's pre-hook
    before = len(runner.modules.times[""])
    steps = 6 * SAMPLE_EVERY
    _train(model, opt, steps)
    recorded = runner.modules.times[""][before:]
    assert abs(len(recorded) - steps // SAMPLE_EVERY) <= 1
    # Had the update been counted, every time would be over its 30 ms sleep. The median, and a
    # bound at the sleep itself: the suite's other worker may hold the cores during a forward.
    assert sorted(recorded)[len(recorded) // 2] < SlowSGD.SLEEP_S, recorded
    rows = {m["name"]: m for m in opt.session.profile_document()["modules"]}
    assert 0 < rows[""]["forward_time_s"] < SlowSGD.SLEEP_S
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "bytescheduler"])
def test_once_planned_the_session_times_only_the_iterations_the_profiler_samples(
        policy: str) -> None:
    """After the profiling steps the engine records every SAMPLE_EVERY-th iteration; the
    figures the session and the runner time themselves (compute before backward, step_s, the
    optimizer calls) follow the same rounds rather than costing Python every iteration."""
    from commsched.runtime.planning.lifecycle import SAMPLE_EVERY
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2)
    profiler = opt.session.engine.profiler
    _train(model, opt, SETTLED + 2 * SAMPLE_EVERY)  # the window restarted when it settled

    def counts() -> tuple[int, int, int, int]:
        compute = profiler.compute_samples
        return (len(profiler.ready_samples), len(compute["before_first_ready_s"]),
                len(compute["step_s"]), len(profiler.update_samples))

    before = counts()
    steps = 6 * SAMPLE_EVERY
    _train(model, opt, steps)
    grown = [after - start for after, start in zip(counts(), before, strict=True)]
    assert grown[0] == steps // SAMPLE_EVERY  # the engine's own sampled rounds
    assert grown[1] == grown[2] == steps // SAMPLE_EVERY
    if opt.session.mode.defers_updates:  # one call per update group and sampled iteration
        groups = len(opt.plan.update_groups)
        # The updates run in the next forward pass: the window may start or end one round off.
        assert abs(grown[3] - steps // SAMPLE_EVERY * groups) <= groups
    else:
        assert grown[3] == 0
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "bytescheduler"])
def test_a_settled_plan_is_sampled_closely_then_rarely(policy: str) -> None:
    """Note [Sampling the profile]: every SAMPLE_EVERY-th iteration for SAMPLED_CLOSELY
    iterations after the plan settled, then every SAMPLE_EVERY_LATER-th."""
    from commsched.runtime.planning.lifecycle import (
        SAMPLE_EVERY,
        SAMPLE_EVERY_LATER,
        SAMPLED_CLOSELY,
    )
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2)
    # The schedule of a world with peers: a world of one would step as the plain optimizer from
    # its first rare sample on (Note [A world of one steps as the plain optimizer]).
    opt.session.never_pass_through()
    engine = opt.session.engine
    sampled = []
    for _ in range(SETTLED + SAMPLED_CLOSELY + 2 * SAMPLE_EVERY_LATER):
        sampled.append(engine.sampling)
        _train(model, opt, 1)
    settled = SETTLED  # Note [Planning from the steady state]
    assert all(sampled[:settled])  # the profiling steps and the refinement record every one
    closely = sampled[settled:settled + SAMPLED_CLOSELY]
    later = sampled[settled + SAMPLED_CLOSELY:]
    assert abs(sum(closely) - len(closely) // SAMPLE_EVERY) <= 1
    assert 1 <= sum(later) <= len(later) // SAMPLE_EVERY_LATER + 1
    opt.session.close()


def test_a_plan_settled_in_the_warm_up_is_described_whole_only_after_it() -> None:
    """Note [Sampling the profile]: `ddp` settles after one iteration, in the process's warm-up;
    its window is used whole only from WARM_UP_STEPS on."""
    from commsched.runtime.planning.lifecycle import SAMPLE_EVERY, WARM_UP_STEPS
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy="ddp", named_parameters=model.named_parameters())
    profiler = opt.session.engine.profiler
    steady = []
    for step in range(WARM_UP_STEPS + 3 * SAMPLE_EVERY):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
        steady.append(profiler.steady)
    assert not any(steady[:WARM_UP_STEPS]) and steady[-1]
    assert 1 <= profiler.iterations <= 3  # the window restarted past the warm-up
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "prophet"])
def test_a_policy_replans_once_from_its_own_plans_iterations(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Planning from the steady state]: `refine_steps` after the profiling steps the policy
    plans again, once, from its own plan's iterations, on the profiling steps' network."""
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2)
    lifecycle, profiler = opt.session.lifecycle, opt.session.engine.profiler
    made: list[tuple[NetModel, int]] = []
    policy_plan = lifecycle._policy_plan

    def spy(profile: Profile, net: NetModel) -> Plan:
        made.append((net, profiler.iterations))
        return policy_plan(profile, net)

    monkeypatch.setattr(lifecycle, "_policy_plan", spy)
    _train(model, opt, 2)
    assert len(made) == 1 and lifecycle.replan_at == SETTLED
    # Blocks timed under the policy's own plan that would fit another network.
    for _ in range(2 * SETTLED):
        profiler._add_round({"allreduce": [(1000, 5.0), (2000, 9.0)]})
    assert profiler.net_model() != made[0][0]
    _train(model, opt, REFINE_STEPS)
    assert len(made) == 2 and made[1][0] == made[0][0]
    # Every iteration recorded (an overlap plan's latest is recorded in the next forward pass).
    assert made[1][1] >= SETTLED - 1
    _train(model, opt, 3 * REFINE_STEPS)
    assert len(made) == 2 and lifecycle.replan_at == SETTLED
    assert not any(n == 9.0 for rounds in profiler.collective_rounds
                   for blocks in rounds.values() for _, n in blocks)  # the window restarted
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "prophet"])
def test_a_benchmark_times_a_policy_only_after_its_refinement(policy: str) -> None:
    """`plan_settled` turns True at the steady state's re-plan (Note [Planning from the steady
    state]), not at the end of the profiling steps: a benchmark's warm-up
    (commsched.bench.compare.step_until_settled) steps on until then."""
    from commsched.bench.compare import settling, step_until_settled
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2)
    assert not opt.plan_settled
    planned_before_profile = opt.plan.fingerprint  # the profiling plan
    _train(model, opt, 3)  # the profiling steps and one of the policy's plan
    assert not opt.plan_settled and settling(opt)

    def step(i: int) -> None:
        _train(model, opt, 1)

    assert step_until_settled(opt, step, 3) == SETTLED  # SETTLED steps in all
    assert opt.plan_settled and not settling(opt)
    refined = opt.plan.fingerprint  # may equal `planned`: the same plan from the same ranking
    _train(model, opt, 2 * REFINE_STEPS)
    assert opt.plan_settled and opt.plan.fingerprint == refined != planned_before_profile
    assert step_until_settled(opt, step, 0) == 0
    assert not settling(torch.optim.SGD(model.parameters(), lr=0.1))
    opt.session.close()


def test_fewer_refine_steps_settle_sooner() -> None:
    """The knob `refine_steps` moves the steady state's re-plan: 2 profiling steps, then 3 of
    the policy's first plan."""
    from commsched.bench.compare import step_until_settled
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         named_parameters=model.named_parameters(),
                                         policy="prophet", profile_steps=2, refine_steps=3)
    assert opt.session.config.refine_steps == 3
    _train(model, opt, 2)
    assert opt.session.lifecycle.replan_at == 2 + 3 and not opt.plan_settled
    assert step_until_settled(opt, lambda i: _train(model, opt, 1), 2) == 2 + 3
    opt.session.close()


def test_auto_plans_its_kept_policy_again_from_its_own_iterations() -> None:
    """Note [Planning from the steady state]: once `auto` has kept a plan, REFINE_STEPS
    iterations of it later the same policy with the same knobs is planned again from them;
    a benchmark (commsched.bench.compare.settling) times it only after that."""
    from commsched.bench.compare import settling
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy="auto", named_parameters=model.named_parameters(),
                                         profile_steps=2)
    auto, lifecycle = opt.auto, opt.session.lifecycle
    assert auto is not None
    _train(model, opt, 2)  # the profiling steps
    steps = 2
    while auto.deciding:
        _train(model, opt, 1)
        steps += 1
        assert steps < 200
    kept = auto.chosen
    assert kept is not None and auto.refining and settling(opt)
    assert lifecycle.replan_at is not None and lifecycle.replan_at > steps
    _train(model, opt, REFINE_STEPS + 1)
    assert auto.refined and not auto.refining and not settling(opt)
    assert auto.chosen is not None and auto.chosen.policy == kept.policy
    assert auto.chosen.knobs == kept.knobs and opt.plan is auto.chosen.plan
    _train(model, opt, 3 * REFINE_STEPS)
    assert opt.plan is auto.chosen.plan  # once
    opt.session.close()


@pytest.mark.parametrize("policy", ["horovod", "auto"])
def test_the_steady_state_re_plan_follows_the_profiling_steps_under_a_lossy_compressor(
        policy: str) -> None:
    """A compressed plan is named `<policy>+<compressor>`: the profiling steps' plan too, and
    what follows them must still be the policy's plan (auto: its choice), then its re-plan."""
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2,
                                         compression=commsched.Compression.topk(ratio=0.25))
    assert opt.plan.policy.startswith("layerwise+")
    _train(model, opt, 2)
    assert not opt.plan.policy.startswith("layerwise")
    auto = opt.auto
    if auto is None:
        assert opt.session.lifecycle.replan_at == SETTLED
    else:
        assert auto.chosen is not None and auto.deciding
        for _ in range(200):
            if auto.refined:
                break
            _train(model, opt, 1)
        assert auto.refined and auto.settled and opt.plan is auto.chosen.plan
    opt.session.close()


@pytest.mark.parametrize("policy", ["bytescheduler", "auto"])
def test_profiling_steps_run_one_block_at_a_time(policy: str) -> None:
    """Note [Profiling one block at a time]: the profiling plan's blocks are timed alone; the
    policy's plan gets the configured credit (auto: the one it chose) once it is installed."""
    from commsched.runtime.planning.lifecycle import PROFILING_CREDIT
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                         policy=policy, named_parameters=model.named_parameters(),
                                         profile_steps=2, credit_bytes=4 << 20)
    lifecycle = opt.session.lifecycle
    assert lifecycle.credit == PROFILING_CREDIT
    _train(model, opt, 1)
    assert lifecycle.credit == PROFILING_CREDIT and lifecycle.replan_at == 2
    _train(model, opt, 2)
    assert lifecycle.credit == 4 << 20
    opt.session.close()


@pytest.mark.parametrize("policy", ["bytescheduler", "dear"])
def test_deferred_updates_follow_hyper_parameters_set_between_steps(policy: str) -> None:
    """The snapshot taken at step() is re-taken only when a hyper-parameter object changed: a
    schedule that holds the learning rate for a few steps, then moves it (and the weight decay),
    must give the plain optimizer's parameters."""
    model, twin = _model(), _model()

    def make(params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=1e-2)

    ours = commsched.DistributedOptimizer(make(model.parameters()), model=model, policy=policy,
                                          named_parameters=model.named_parameters(),
                                          profile_steps=2)
    plain = make(twin.parameters())
    for step in range(10):
        for opt in (ours, plain):
            if step % 3 == 0:  # held for three steps, then a new value
                opt.param_groups[0]["lr"] = 1e-2 / (step + 1)
            if step == 7:
                opt.param_groups[0]["weight_decay"] = 0.5
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        step_alike(((model, ours), (twin, plain)), x)
    assert ours.session.mode.defers_updates
    ours.flush()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)

