"""A session's plan over its life: profile, plan, install, re-plan, and `auto`'s choice.

    wrap:         policy 'ddp': its static buckets until iteration 1, then rebuilt from the
                  observed ready order; other policies with profile_steps > 0: one block per
                  tensor (the profiling plan, one block in flight at a time: Note [Profiling
                  one block at a time]) until that many iterations ended; else the policy's
                  plan from the default cost model at once
    re-plan:      every rank's profile is gathered and every rank builds the same plan from
                  the world's (world_profile.py: the collectives of the rank the others wait
                  for, every rank's compute); `auto` simulates every candidate and takes the
                  fastest
    refine:       the policy re-plans once more after `refine_steps` iterations of its own plan
                  (`auto`: of the plan it kept after its trials), from their ready times (Note
                  [Planning from the steady state])
    `auto` check: after auto.CHECK_STEPS measured iterations, re-plan once if off by > 20%

Every install compares the plan's fingerprint across ranks before the engine gets it, so no
rank can run a different plan (see Note [The order is the plan's] in csrc/engine.h).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from ...compression import Compressor
from ...config import Config, Policy
from ...plan import (
    NetModel,
    Plan,
    Profile,
    TensorSpec,
    is_profiling_plan,
    make_plan,
    make_profiling_plan,
)
from ...plan.compressed import WireLayout, compressed_plan
from ...plan.sharding import sharded_plan
from ...sim import FittedNetwork, RunProfile, profile_from_document
from ...sim.compressed import CompressedRun
from ...sim.overlap import with_update_groups
from ...sim.rank import PlanCache, planner_model
from ...world import World, check_identical
from ..compression.gradients import CompressedGradients
from ..engine.handle import EngineHandle
from ..engine.profiler import profile_document
from ..iteration import IterationState
from ..modes.overlap.runner import OverlapRunner
from ..modes.shard_state import ShardedState
from .auto.state import AutoState, Verdict
from .world_profile import gather_critical, with_world_compute, world_document

log = logging.getLogger("commsched")

# Note [Sampling the profile]
# Once the plan is built (and `auto` has checked it), the profiler records every SAMPLE_EVERY-th
# iteration for SAMPLED_CLOSELY iterations, so that the profile describes the plan that runs
# (what a report, a benchmark's prediction or a written profile reads), then every
# SAMPLE_EVERY_LATER-th: a recorded iteration costs its figures' reading and the profiler's
# Python, and on a small model that is no longer small (the built-in MLP in a world of one,
# under bytescheduler: sampling every 4th iteration cost several percent of the iteration more
# than sampling every 64th, which cost hardly more than sampling none). PyTorch DDP samples its
# runtime statistics every 100th iteration for the same reason (kDDPRuntimeLoggingSampleRate).
# When the plan settles, the profiler's window starts afresh at the next recorded iteration
# (Profiler.restart_window): `auto`'s trial windows, each a plan of its own and all of them
# recorded, otherwise filled half the window a benchmark's end-of-run profile reads (the 3-rank
# CNN at 1 Gbit/s: its compute before the first gradient read far longer than under the plan it
# kept, and the simulator's prediction of that plan came out far too long). That restarted
# window is the settled plan's past its warm-up from its first iteration, so its profile is made
# from all of it (Profiler.steady), where other windows use their latest half: a benchmark's
# end-of-run profile holds about 15 sampled iterations, and a median of the latest 7 moves with
# one slow iteration. The compute before the first gradient read longer for dear on the 2 Gbit/s
# Transformer than for any other candidate of that job, and its prediction was the simulator
# validation's worst (too long); iteration by iteration, the later rank's figure ranged widely
# in a re-run of dear there (figures: benchmarks/notes/README.md, 'Sampling the profile').
SAMPLE_EVERY = 4
SAMPLED_CLOSELY = 64
SAMPLE_EVERY_LATER = 64

# A process's first iterations are slower than its steady state (allocations, caches: the
# Transformer's backward, Note [Planning from the steady state] in lifecycle.py); a profiler
# window that starts earlier is not used whole (Note [Sampling the profile]). Most plans settle
# later anyway (the profiling steps, then `refine_steps` of their own); `ddp`'s settles
# after one iteration.
WARM_UP_STEPS = 10


class SamplingSchedule:
    """The engine's sampling rate and the profiler's window, iteration by iteration."""

    def __init__(self, engine: EngineHandle) -> None:
        self._engine = engine
        self._settled_at: int | None = None  # the iteration the plan in place settled at
        # The iteration from which the profiler's window is the settled plan's whole, and how
        # many iterations this process has run.
        self._steady_at: int | None = None
        self._iterations_run = 0
        self._every = engine.sample_every

    def iteration_ended(self, iteration: int, settled: bool) -> None:
        """`settled`: the plan in place is the one that stays (no re-plan, no `auto` trial due)."""
        self._iterations_run += 1
        if not settled:
            self.unsettle()  # a re-plan: the window no longer describes the plan
            every = 1
        else:
            if self._settled_at is None:
                self._settled_at = iteration
                # From here the profile is the settled plan's, whole once this process is past
                # its warm-up.
                self._steady_at = iteration + max(WARM_UP_STEPS - self._iterations_run, 0)
                if self._steady_at > iteration:
                    self._engine.profiler.restart_window()
            if iteration == self._steady_at:
                self._engine.profiler.restart_window(steady=True)
            closely = iteration - self._settled_at < SAMPLED_CLOSELY
            every = SAMPLE_EVERY if closely else SAMPLE_EVERY_LATER
        if every != self._every:  # the engine's, without a property call per iteration
            self._every = self._engine.sample_every = every

    @property
    def settled(self) -> bool:
        """Whether the plan in place is the one that stays: profiling, the steady state's
        re-plan and `auto`'s checks and trials are over (`auto` choosing afresh after a change
        of wire unsettles it)."""
        return self._settled_at is not None

    @property
    def rarely(self) -> bool:
        """Whether the plan has settled and its closely sampled iterations are over: the profile
        describes it, and from here on it is sampled every SAMPLE_EVERY_LATER-th iteration."""
        return self._every == SAMPLE_EVERY_LATER

    def unsettle(self) -> None:
        """The plan changed (a re-plan, a compressor's start): it settles afresh."""
        if self._settled_at is not None:
            self._settled_at = self._steady_at = None
            self._engine.profiler.unsteady()


class ModeFollower(Protocol):
    """The session's step modes as the plan's lifecycle and the binding drive them
    (runtime/modes/choice.py, StepModes, which imports this module)."""

    @property
    def runner(self) -> OverlapRunner | None: ...
    def bind(self, runner: OverlapRunner | None) -> None: ...
    def unbind(self) -> OverlapRunner | None: ...
    def follow(self, plan: Plan, overlaps: bool) -> None: ...
    def shard(self, sharded_plan: bool) -> None: ...
    def finish(self) -> None: ...

# Note [Planning from the steady state]
# The profiling steps are the run's first iterations: warm-up (a Transformer's backward took
# several times its steady time for about ten steps here), and the ready times of their latest
# half are two or three of them. Plans that pack what is ready when the channel frees
# (ByteScheduler, Prophet, MG-WFBP) change with those ready times: at 1 Gbit/s on 2 ranks,
# Prophet's plan made from the profiling steps, simulated on its own end-of-run profile, was
# predicted several percent slower, on the CNN and on the Transformer, than the plan made from
# that end profile. So the policy re-plans once more after `refine_steps` (the knob, default 10)
# iterations of its own plan, every one of them sampled, so that the latest half of the
# profiler's window holds only its own plan's iterations past their first two (with fewer, the
# plan settles sooner, on fewer of them). `auto` does the same for the plan it keeps
# after its trials (the same policy with the same knobs, from the window restarted when it kept
# it). With the refinement the gap between the installed plan and the one made from the end
# profile came to a few percent at most, for Prophet and ByteScheduler on both models (figures:
# benchmarks/notes/README.md, 'Planning from the steady state'). The network stays the one
# fitted on the profiling steps, where blocks of every size ran one at a time (Note [Profiling
# one block at a time]): a policy's own blocks are few sizes in flight together and fit worse
# (Note [Fitting a collective's cost] in collective_fit.py). The refinement costs one more
# gathering of the profile and one more plan, in a job's first seconds.

# Note [Profiling one block at a time]
# The profiling steps run their blocks one at a time (a credit of one byte: a block waits until
# nothing is in flight), whatever credit the policy's plan gets. The profiling plan is there to
# be timed, and blocks in flight together share the link: the engine's service time
# (completion minus the later of launch and the previous completion) then splits their shared
# time unevenly, between blocks and between collectives. With the configured 16 MiB credit,
# `auto`'s profile of the 3-rank CNN timed a 4 MiB all-gather at several times what it takes
# alone, and `auto` ranked `dear` last where it measured fastest (figures:
# benchmarks/notes/README.md, 'Profiling one block at a time'). The policy's plan gets its
# credit (the configured one, or the one `auto` chose) when it is installed.
PROFILING_CREDIT = 1


@dataclass(frozen=True)
class Scaling:
    """How a block's bytes are written on the wire: compression and the pre/post factors
    (Horovod's gradient_predivide_factor and Average)."""

    compression: type[Compressor]
    prescale: float
    postscale: float


class PlanLifecycle:
    def __init__(self, world: World, config: Config, specs: list[TensorSpec],
                 engine: EngineHandle, modes: ModeFollower, scaling: Scaling,
                 state: IterationState) -> None:
        self._world = world
        self._config = config
        self._specs = specs
        self._engine = engine
        # The session's step modes: each install tells them whether the plan overlaps or
        # shards (Note [A step mode is an object] in modes/base.py).
        self._modes = modes
        self._scaling = scaling
        self.auto: AutoState | None = AutoState() if config.policy is Policy.AUTO else None
        self.credit = config.credit_bytes  # kept for checkpoints: `auto` may choose another
        self.replan_at: int | None = None  # the iteration after which the policy's plan is built
        self._state = state  # its restore_unchecked (Note [One iteration's state])
        self.sampling = SamplingSchedule(engine)
        # The profile document's collectives of the profiling steps, for the steady state's
        # re-plan (Note [Planning from the steady state]).
        self._profiled_collectives: dict | None = None
        self._last_end: float | None = None
        # While a lossy compressor runs: it, and its wire tensors, which every plan carries.
        self.compressor: CompressedGradients | None = None
        # Set by the binding under shard_optimizer (Note [The sharded state follows the plan]).
        self.sharded: ShardedState | None = None
        self.set_credit(config.credit_bytes)

    @property
    def wire(self) -> WireLayout | None:
        return None if self.compressor is None else self.compressor.layout

    @property
    def plan(self) -> Plan:
        """The plan the engine runs now."""
        assert self._engine.plan is not None
        return self._engine.plan

    def start(self, iteration: int = 0) -> None:
        """Installs the plan for the iterations from `iteration` on (0 at wrap time; an elastic
        job's re-formed world starts at its committed iteration and profiles its new size)."""
        replan_after, first, credit = self._first_plan()
        self.replan_at = None if replan_after is None else iteration + replan_after
        self.install(first)
        self.set_credit(credit)
        if self.replan_at is None:
            self._modes.follow(first, overlaps=self._config.policy.overlaps_iterations)

    def _first_plan(self) -> tuple[int | None, Plan, int]:
        """How many iterations the first plan runs before the policy's plan (None: for good),
        that plan, and its credit."""
        cfg = self._config
        if cfg.policy is Policy.DDP:  # its static buckets for one iteration: not profiling
            return 1, self._policy_plan(Profile(), NetModel()), cfg.credit_bytes
        if cfg.profile_steps > 0:
            return cfg.profile_steps, self._profiling_plan(Profile()), PROFILING_CREDIT
        if cfg.policy is Policy.AUTO:
            raise ValueError("commsched: policy 'auto' chooses from a profile: "
                             "COMMSCHED_PROFILE_STEPS (profile_steps) must be > 0")
        # Nothing profiled yet: the profiler's default cost model with the configured overrides.
        net = self._engine.profiler.net_model(cfg.alpha, cfg.beta)
        return None, self._policy_plan(Profile(), net), cfg.credit_bytes

    def _policy_plan(self, profile: Profile, net: NetModel) -> Plan:
        cfg = self._config
        if self.wire is None:
            return make_plan(cfg.policy, self._specs, profile, net, cfg)
        return compressed_plan(lambda specs, prof: make_plan(cfg.policy, specs, prof, net, cfg),
                               self._specs, self.wire, profile)

    def _profiling_plan(self, profile: Profile) -> Plan:
        policy = self._config.policy
        if self.wire is None:
            return make_profiling_plan(self._specs, profile, policy)
        return compressed_plan(lambda specs, prof: make_profiling_plan(specs, prof, policy),
                               self._specs, self.wire, profile)

    def reinstall(self, iteration: int) -> None:
        """Rebuilds the plan in place for the same stage of the run (profiling, or the policy's
        plan from the world's profile, as refined) after `wire` changed (compression starting
        mid-run, top-k's next warm-up stage); `auto` chooses afresh, its refinement due."""
        profiling = is_profiling_plan(self.plan)
        if self.auto is not None and not profiling:
            self.auto.rewire()
            self.replan_at = None  # a refinement of the old choice: the new one gets its own
        elif iteration == self.replan_at:
            return  # iteration_ended re-plans now anyway
        if profiling:
            self.install(self._profiling_plan(Profile()))
        else:
            self.replan(refine=True)
        self.sampling.unsettle()  # the window held the old plan: settle afresh

    # -- after each iteration ---------------------------------------------------------------

    def iteration_ended(self, iteration: int) -> None:
        """Feeds `auto`'s check and re-plans when the profiling steps are over."""
        auto = self.auto
        if auto is not None:
            if self._last_end is not None and auto.record(time.perf_counter() - self._last_end):
                verdict = auto.conclude(self._world.broadcast_object(auto.local_median()))
                if verdict is Verdict.REPLAN:
                    self.replan()
                elif verdict is Verdict.TRIALS:
                    self._replan_trials()
                    self._install_choice()
                elif verdict is Verdict.INSTALL:
                    self._install_choice()
            self._last_end = time.perf_counter()
        if iteration == self.replan_at:
            profiling = is_profiling_plan(self.plan)
            if auto is not None and not profiling:
                self._refine_auto()
            else:
                self.replan(refine=not profiling)
            if profiling and auto is None:
                self.replan_at = iteration + self._config.refine_steps
        if auto is not None and not auto.deciding and not auto.refined and not auto.refining \
                and auto.choices:
            # Note [Planning from the steady state]: the plan kept, from its own iterations.
            auto.refining = True
            self.replan_at = iteration + self._config.refine_steps
            self._engine.profiler.restart_window()  # the trials ran other plans
        settled = (self.replan_at is None or iteration >= self.replan_at) \
            and (auto is None or auto.settled)
        self.sampling.iteration_ended(iteration, settled)

    def replan(self, refine: bool = False) -> None:
        """Builds the policy's plan from the world's profile (`gather_critical`), identically on
        every rank; `refine`: the steady state's re-plan, on the network of the profiling
        steps when this process fitted it (Note [Planning from the steady state])."""
        if self.auto is not None:
            self._replan_auto()
            return
        cfg, profiler = self._config, self._engine.profiler
        overlap = self._modes.runner is not None and cfg.policy.overlaps_iterations
        profiling = is_profiling_plan(self.plan)
        (profile, net, document), world = gather_critical(
            self._world, (profiler.profile(), profiler.net_model(cfg.alpha, cfg.beta),
                          self.profile_document()), profiler.samples_by_op,
            profiler.iteration_rows())
        if world is not None:
            profile = Profile(tuple(0.0 if t is None else t for t in world.ready_times))
            document = with_world_compute(document, world)
        if profiling:
            self._profiled_collectives = document["collectives"]
        elif refine and self._profiled_collectives is not None:
            # See Note [Planning from the steady state].
            document = {**document, "collectives": self._profiled_collectives}
            net = planner_model(FittedNetwork.from_document(document), cfg)
        plan = self._policy_plan(profile, net)
        if overlap:
            run, compressed = _run_of(document, self.compressor)
            plan = with_update_groups(run, plan, FittedNetwork.from_document(document),
                                      None if compressed is None else compressed.compute)
        self.write_profile(document)
        log.info("commsched: rank %d installs %s plan %s: %d blocks, %d update groups "
                 "(alpha=%.3g s, beta=%.3g s/B)", self._world.rank, plan.policy,
                 plan.fingerprint, len(plan.blocks), len(plan.update_groups), net.alpha, net.beta)
        self.install(plan)
        self.set_credit(cfg.credit_bytes)
        self._modes.follow(plan, overlaps=cfg.policy.overlaps_iterations)

    def _replan_auto(self) -> None:
        """Simulates every valid plan on the world's profile and installs the fastest."""
        assert self.auto is not None
        document = self._world_document()
        if is_profiling_plan(self.plan):
            self._profiled_collectives = document["collectives"]
        # With no peer there is nothing to overlap: a world of one runs a synchronous plan. Its
        # synchronous plans all do the same work (no collective), so trials would measure noise
        # and only delay its passing through (Note [A world of one steps as the plain optimizer]).
        lone = self._world.size == 1
        cfg = dataclasses.replace(self._config, auto_trials=0) if lone else self._config
        self.auto.choose(document, cfg, self._modes.runner is not None and not lone,
                         _run_of(document, self.compressor)[1],
                         1 if self.sharded is None else self._world.size)
        self.write_profile(document)
        self._install_choice()
        # Note [Trials of steady plans]: the trials' plans come from the choice's own window.
        self._engine.profiler.restart_window()

    def _steady_document(self) -> dict:
        """The world's profile document of the plan running now, with the collectives of the
        profiling steps when this process fitted them (Note [Planning from the steady state];
        all ranks call this together)."""
        document = self._world_document()
        if self._profiled_collectives is not None:
            document = {**document, "collectives": self._profiled_collectives}
        return document

    def _replan_trials(self) -> None:
        """Plans every candidate `auto` is about to measure again, with its knobs, from the
        choice's check window (Note [Trials of steady plans])."""
        auto = self.auto
        assert auto is not None
        document = self._steady_document()
        run, compressed = _run_of(document, self.compressor)
        cache, net = PlanCache(run, self._config, compressed), FittedNetwork.from_document(document)
        auto.replan_trials({index: cache.plan(auto.choices[index].policy,
                                              auto.choices[index].knobs, net)
                            for index in auto.trial_candidates()})

    def _refine_auto(self) -> None:
        """Plans `auto`'s kept policy, with its knobs, again from the iterations it ran since
        it was kept, on the network `auto` chose with (Note [Planning from the steady state])."""
        auto = self.auto
        assert auto is not None
        chosen = auto.chosen
        if chosen is None:  # restored from a checkpoint on every rank: no ranking was saved
            auto.refined, auto.refining = True, False
            return
        document = self._steady_document()
        run, compressed = _run_of(document, self.compressor)
        plan = PlanCache(run, self._config, compressed).plan(
            chosen.policy, chosen.knobs, FittedNetwork.from_document(document))
        self.write_profile(document)
        log.info("commsched auto: rank %d plans %s %s again from its own iterations: %s, %d "
                 "blocks", self._world.rank, chosen.policy.value, chosen.knobs, plan.fingerprint,
                 len(plan.blocks))
        auto.refine(plan)
        self._install_choice()

    def _install_choice(self) -> None:
        """Installs the plan `auto` has chosen now (its choice, a runner-up it measures, or the
        measured-fastest), with its credit and its mode of the overlap runner."""
        assert self.auto is not None and self.auto.chosen is not None
        chosen = self.auto.chosen
        self.install(chosen.plan)
        self.set_credit(int(chosen.knobs.get("credit_bytes", self._config.credit_bytes)))
        self._modes.follow(chosen.plan, overlaps=chosen.policy.overlaps_iterations)

    # -- profile ------------------------------------------------------------------------------

    def _world_document(self) -> dict:
        """The profile document of the rank the others wait for, with every rank's compute
        (all ranks call this together: world_profile.world_document)."""
        profiler = self._engine.profiler
        return world_document(self._world, self.profile_document(), profiler.samples_by_op,
                              profiler.iteration_rows())

    def profile_document(self) -> dict:
        """This rank's profile as the JSON document of docs/profile.md."""
        runner, sharded = self._modes.runner, self.sharded
        modules = runner.modules if runner else None
        return profile_document(self._specs, self._engine.profiler, self._world.size,
                                modules.order if modules else [], modules.times if modules else {},
                                runner.first_users() if runner else None,
                                self._world.size if sharded and sharded.active else 1)

    def write_profile(self, document: dict | None = None) -> None:
        if self._config.profile and self._world.rank == 0:
            _write_json(self._config.profile,
                        self.profile_document() if document is None else document)

    # -- installing ---------------------------------------------------------------------------

    def finish_updates(self) -> None:
        """Applies the updates an overlap plan defers, before the plan or the wire changes."""
        self._modes.finish()

    def install(self, plan: Plan) -> None:
        self.finish_updates()
        check_identical(self._world, "plan fingerprints", [plan.policy, plan.fingerprint])
        self.install_local(plan)

    def install_local(self, plan: Plan) -> None:
        scaling, sharded = self._scaling, self.sharded
        shard = sharded is not None and not is_profiling_plan(plan)
        self._engine.install(plan, scaling.compression, scaling.prescale, scaling.postscale,
                             sharded_plan(plan) if shard else None)
        if sharded is not None:
            sharded.install(plan if shard else None)
            self._modes.shard(shard)

    def set_credit(self, nbytes: int) -> None:
        self.credit = nbytes
        self._engine.set_credit(nbytes)

    def restored(self, plan: Plan, replan_at: int | None, credit: int, compare: bool) -> None:
        """A checkpoint's plan, installed on this rank alone; with `compare`, the ranks compare
        what they restored at the next `check_restored`."""
        self.install_local(plan)
        self.set_credit(credit)
        self.replan_at = replan_at
        self._state.restore_unchecked = self._state.restore_unchecked or compare

    def check_restored(self, iteration: int) -> None:
        """After load_state_dict() changed the plan or the position, every rank compares them
        before the first collective of the next iteration (see
        commsched.runtime.checkpoint_entry)."""
        if self._state.restore_unchecked:
            self._state.restore_unchecked = False
            check_identical(self._world, "plans restored by load_state_dict() (policy, "
                            "fingerprint, iteration, re-plan iteration)",
                            [self.plan.policy, self.plan.fingerprint, iteration, self.replan_at])


def _write_json(path: str, document: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)


def _run_of(document: dict, compressor: CompressedGradients | None
            ) -> tuple[RunProfile, CompressedRun | None]:
    """The profile as the simulator reads it; under a lossy compressor, with the wire tensors
    this run sends (their exact layout, not one guessed from the profile)."""
    run = profile_from_document(document)
    compressed = None if compressor is None else compressor.simulated(run)
    return (run, None) if compressed is None else (compressed.run, compressed)
