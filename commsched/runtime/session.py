"""One wrapped optimizer's run: its engine, its plan over time, its step mode, the sparse
route and the timing the profiler needs, with one iteration counter.

What happens to one gradient (read top to bottom):
    backward:  the parameter's post-accumulate-grad hook, a C++ object of the gradient
               intake (csrc/gradient_intake.h), runs `first_gradient` once per iteration and
               counts the passes: after the last of backward_passes_per_step, the gradient goes
               to the engine, which reduces it in place in ``p.grad`` when its block's turn
               comes (csrc/engine.h); what the intake leaves to Python is GradientHooks.slow_path's
    step():    the step mode in place (modes/): the synchronous one reduces what was not
               produced (as zeros), waits for every block, and the user's optimizer steps as
               usual; the overlap one launches the rest and returns, and the runner applies each
               group's update in the next forward pass (commsched.runtime.modes.overlap.runner)
DistributedOptimizer keeps Horovod's surface and delegates everything else here. A session holds:
its WorldBinding (world_binding.py: what it makes for the world it runs in), its GradientHooks and
Accumulation (intake/gradient_intake.py: every hook it registers, what the gradient intake leaves to
Python, the intake itself, the passes counted and what no_sync() holds back), its ElasticGuard
(elastic_guard.py: re-binding where an elastic job's world was re-formed, and what a failed
iteration forgets), its StepModes (modes/: which mode step() runs, and the overlap runner) and the
Resources released with it (release.py). Beside this file: `wrap.py` (the options, the specs, the
check that ranks agree).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import torch

from ..config import Config
from ..plan import Plan
from ..world import World, registry
from ..world.errors import elastic
from .compression.gradients import CompressedGradients
from .deferred import DeferredUpdates
from .elastic_guard import ElasticGuard, refuse_in_elastic_job
from .engine.handle import EngineHandle
from .engine.step_clock import StepClock
from .intake.gradient_intake import Accumulation, GradientHooks
from .intake.sparse_route import SparseExchange, sparse_parameter_ids
from .iteration import IterationState
from .modes import StepMode, StepModes
from .modes.overlap.runner import OverlapRunner
from .modes.shard_state import ShardedState
from .planning.lifecycle import PlanLifecycle
from .release import Resources, release, release_orphans
from .step_vote import NoVote, StepVote
from .world_binding import WorldBinding
from .wrap import WrapOptions, make_specs

T = TypeVar("T")

# The phase the heartbeats publish (world.registry.Activity): one assignment where it changes.
_activity = registry.activity

class _FromBinding(Generic[T]):
    """A session's attribute that its WorldBinding holds (binding.py)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, session: Session, owner: type | None = None) -> T:
        return cast(T, getattr(session.binding, self.name))


def _call(call: Callable[..., None], *args: Any) -> None:
    call(*args)


def _grad(param: torch.Tensor) -> torch.Tensor:
    assert param.grad is not None, "a sharded step needs every gradient handed over"
    return param.grad


class Session:
    # Made for the world of now (binding.py): at wrap time, or in an elastic Horovod job at the
    # first step and again whenever that world was re-formed (Note [Elastic Horovod]).
    world = _FromBinding[World]()
    sparse = _FromBinding[SparseExchange]()
    engine = _FromBinding[EngineHandle]()
    clock = _FromBinding[StepClock]()
    lifecycle = _FromBinding[PlanLifecycle]()
    compressed = _FromBinding[CompressedGradients | None]()

    def __init__(self, optimizer: torch.optim.Optimizer, base_cls: type[torch.optim.Optimizer],
                 named: list[tuple[str, torch.Tensor]], options: WrapOptions,
                 config: Config) -> None:
        release_orphans()
        self.config = config
        self.options = options
        elastic_job = elastic()
        if elastic_job:
            refuse_in_elastic_job(config)
        self.state = IterationState()  # Note [One iteration's state] (iteration.py)
        self.base_cls = base_cls  # the user's optimizer class (the wrapper's class derives from it)
        self.names = {p: n for n, p in named}
        routed_ids = sparse_parameter_ids(options.model, options.sparse_as_dense)
        # The parameters the sparse route carries, and the dense ones the engine reduces.
        self.routed = [(n, p) for n, p in named if p.requires_grad and id(p) in routed_ids]
        tracked = [(n, p) for n, p in named if p.requires_grad and id(p) not in routed_ids]
        self.params = [p for _, p in tracked]
        self.specs = make_specs(tracked, options.group_of)
        self.deferred = DeferredUpdates(base_cls, optimizer)
        self.hooks = GradientHooks(self, self.state)
        self.modes = StepModes(self)
        # Note [a dropped optimizer releases its engine] (runtime/release.py).
        self._resources = Resources(None, None, self.hooks.handles, threading.get_ident())
        self._release = weakref.finalize(optimizer, release, self._resources)
        self._release.atexit = False  # at exit commsched.shutdown() stops what is left
        self.binding = WorldBinding(config, options, elastic_job, self.specs, self.params,
                                    self.routed, self.deferred, base_cls, self._resources,
                                    self.modes, self.state)
        self.accumulation = Accumulation(options.backward_passes_per_step, self.params,
                                         self.routed, self.binding,
                                         self.hooks.first_gradient_call(), self.hooks.slow_path(),
                                         self.state)
        self.elastic_guard = ElasticGuard(self.binding, self.accumulation)
        # What runs a call that may fail as a collective does: outside an elastic job nothing
        # is to be forgotten after a failure.
        self.guarded: Callable[..., None] = self.elastic_guard.run if elastic_job else _call
        if not elastic_job:  # an elastic job binds at its first step
            self.bind()
        # Note [Answering the others' collectives]; commsched.Join swaps it for its block.
        self.vote: NoVote | StepVote = StepVote(self.world) if config.uneven_inputs else NoVote()
        self.hooks.install(self.accumulation.intake, self.params, self.routed)
        self.publish("forward")

    def bind(self) -> None:
        """Binds to the world of now (WorldBinding.bind), and starts the plan there."""
        state = self.state  # the engine reads the counter, and must not keep the session alive
        state.restore_unchecked = False  # a new world's plan is its own
        self.binding.bind(lambda: state.iteration, self.accumulation.passes)
        intake = self.accumulation.intake
        intake.set_engine(self.engine.native)  # also an elastic job's new one
        for tid in self.engine.comm_hook.python_ids:
            intake.set_python_only(tid, True)  # the compressor's hand-over is Python's
        elastic_job = self.binding.elastic
        if elastic_job:  # a joining worker starts at 0: rank 0 holds the committed position
            self.state.iteration = int(self.binding.formed.broadcast_object(self.state.iteration))
        self.modes.plain.decide_at_bind(self.world, elastic_job, bool(self.routed),
                                        self.engine.comm_hook.works_alone, self.config)
        self.binding.start(self.state.iteration)

    @property
    def bound(self) -> bool:
        """Whether the engine and its plan exist (in an elastic job: from the first step)."""
        return self.binding.bound

    @property
    def plan(self) -> Plan:
        if not self.bound:
            raise RuntimeError("commsched: in an elastic Horovod job the plan is made at the "
                               "first step, with the world of that step")
        return self.lifecycle.plan

    @property
    def elastic(self) -> bool:
        """Whether this is an elastic Horovod job (Note [Elastic Horovod])."""
        return self.binding.elastic

    @property
    def overlap_runner(self) -> OverlapRunner | None:
        """The runner of this world's overlap plans, where the model may overlap."""
        return self.modes.runner

    @property
    def mode(self) -> StepMode:
        """The step mode that runs now (Note [A step mode is an object] in modes/base.py)."""
        return self.modes.current

    def hook_gradients(self) -> None:
        """Leaves the plain optimizer's step, where it was taken (a session never bound, as an
        elastic job's new worker restoring before its first step, has taken none)."""
        if self.binding.binds:
            self.modes.resume()

    def never_pass_through(self) -> None:
        """Keeps this session stepping through the engine and, under an overlap plan, its
        runner in a world of one: benchmarks.harness.overhead measures the runtime's own cost
        this way, as a world with peers pays it."""
        self.hook_gradients()
        self.modes.plain.possible = False

    # -- gradient hooks -----------------------------------------------------------------------

    def first_gradient(self) -> None:
        """Once per iteration, at its first gradient: what must happen before any gradient is
        handed over. Later gradients of the iteration go straight to the engine."""
        self.vote.cast(self.state.iteration)  # before any collective of the iteration
        if self.binding.elastic:  # Note [Elastic Horovod] in world/bootstrap.py
            self.elastic_guard.rebind_if_stale(self.bind)
        self.accumulation.intake.started = True
        self.publish("backward")
        if self.state.restore_unchecked:
            self.guarded(self.lifecycle.check_restored, self.state.iteration)
        self.mode.first_gradient()

    def set_passes(self, passes: int) -> None:
        self.hook_gradients()  # the hooks count the passes
        self.accumulation.set_passes(passes)

    # -- what every mode's end of an iteration shares ---------------------------------------------

    def launch_rest(self) -> None:
        """Hands over every gradient not yet with the engine, and the compressor's rest."""
        intake = self.accumulation.intake
        runner = self.modes.runner
        if runner is not None:  # Note [No forward pass on a pending update]
            runner.guard.after_backward(self.accumulation.received, self.state.iteration)
        self.engine.comm_hook.launch_rest()
        if not self.hooks.all_handed_over(intake):
            self.hooks.launch_rest(intake, self.params, self.engine,
                                   self.modes.plain.lacked_gradient, runner is None)

    def synchronize(self) -> None:
        """Reduces every gradient into ``p.grad``; missing ones count as zeros, as in Horovod."""
        self.mode.synchronize()

    def reduce(self, sharded: ShardedState | None = None) -> None:
        """Reduces every gradient and waits for it; with `sharded`, the owners update their
        slices between the reduce-scatters and the all-gathers, which then carry parameters."""
        self.vote.cast(self.state.iteration)  # where no gradient came in this iteration
        if self.state.restore_unchecked:
            self.lifecycle.check_restored(self.state.iteration)
        self.launch_rest()
        engine = self.engine
        if sharded is not None:
            params = self.params
            self.clock.time_sharded(lambda: sharded.step(
                engine.reduced_shard, lambda tid: _grad(params[tid]), engine.release))
        else:  # Under an overlap plan (synchronize() before a clipped or scaled step) DeAR's
            # all-gathers would wait for the next forward pass: every gradient is wanted now.
            engine.release_forward_blocks()
        engine.comm_hook.before_wait(self.plan)
        if self.routed:
            self.sparse.exchange()  # while the engine's thread reduces the dense blocks
        engine.wait()
        if sharded is not None:
            sharded.finish()
        engine.comm_hook.after_wait()
        if self.state.densified:
            self.hooks.resparsify(self.params)
        self.end_iteration()
        self.end_of_step()

    def publish(self, phase: str) -> None:
        """Publishes the phase the heartbeats report ("forward", "backward", "step")."""
        _activity.now = (phase, time.monotonic(), self.state.iteration)

    def end_of_step(self) -> None:
        """After an iteration's step(): a world of one may pass through from here on."""
        if self.modes.plain.possible:
            self.modes.maybe_pass_through()

    @property
    def sharded(self) -> ShardedState | None:
        """shard_optimizer's state where it runs (a bound world of more than one rank)."""
        return self.lifecycle.sharded if self.bound else None

    def end_iteration(self) -> None:
        self.accumulation.end_iteration()
        self.state.iteration += 1
        if self.engine.timeline:
            self.engine.mark(f"iteration {self.state.iteration}")
        self.engine.comm_hook.iteration_ended(self.state.iteration)
        self.lifecycle.iteration_ended(self.state.iteration)

    def flush(self, pause: bool = False) -> None:
        """Applies every update still pending from cross-iteration overlap. `pause`: the user
        called it, and the training loop stops here (Note [A pause is not compute] in
        engine/step_clock.py)."""
        self.mode.finish()
        if pause and self.bound:  # unbound (an elastic job before its first step): no clock
            self.clock.pause()

    def profile_document(self) -> dict:
        return self.lifecycle.profile_document()

    def close(self) -> None:
        """Stops this session's engine, destroys its groups (the engine's and the sparse
        route's) and removes its hooks and the runner's module hooks. Updates still deferred
        are dropped (call flush() first to keep them): close() also serves after a failed
        collective, when nothing can be waited for any more."""
        self._resources.owner = threading.get_ident()  # an explicit call releases at once
        self._release()  # the runner's module hooks too


