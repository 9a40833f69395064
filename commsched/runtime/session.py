"""One wrapped optimizer's run: its engine, its plan over time, the overlap runner, the sparse
route and the timing the profiler needs, with one iteration counter.

What happens to one gradient (read top to bottom):
    backward:  the parameter's post-accumulate-grad hook, a C++ object of the gradient
               intake (csrc/gradient_intake.h), runs `_first_gradient` once per iteration and
               counts the passes: after the last of backward_passes_per_step, the gradient goes
               to the engine, which reduces it in place in ``p.grad`` when its block's turn
               comes (csrc/engine.h); what the intake leaves to Python is `_slow_path`'s
    step():    synchronous plans: `synchronize` launches what was not produced (as zeros),
               waits for every block, and the user's optimizer steps as usual;
               overlap plans: `step_deferred` launches the rest and returns; the runner takes
               the gradients out of ``p.grad`` (the engine still writes them) and applies each
               group's update in the next forward pass (commsched.runtime.overlap)
DistributedOptimizer keeps Horovod's surface and delegates everything else here. Beside this
file: `wrap.py` (the options and specs), `gradient_hooks.py` (what the gradient intake leaves to
Python, and the sparse route's hooks), `elastic.py` (re-binding in an elastic Horovod job),
`compressed_intake.py` (a compressed tensor's hook) and `release.py` (a dropped wrapper's release).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import _C
from ..config import Config, Policy
from ..ops import ReduceOp
from ..outputs import prepare_file
from ..plan import Plan
from ..world import World, bootstrap, check_identical, parameter_signature, registry
from ..world.errors import elastic
from ..world.process_sets import world_for
from .clock import StepClock
from .compressed import CompressedGradients
from .compressed_intake import CompressedIntake
from .deferred import DeferredUpdates
from .elastic import ElasticBinding
from .engine import EngineHandle
from .gradient_hooks import GradientHooks
from .lifecycle import PlanLifecycle, Scaling
from .overlap import OverlapRunner
from .overlap_support import check_overlap_allowed, overlap_possible
from .passthrough import Passthrough
from .release import Resources, release, release_orphans
from .sparse import SparseExchange, sparse_parameter_ids
from .timeline import timeline_path
from .wrap import WrapOptions, dense_layout, make_specs

_NO_SYNC_AFTER_SEND = (
    "commsched: no_sync() was entered after a backward pass outside it sent gradients, before "
    "step(): those gradients are being averaged in place in p.grad, where the backward passes "
    "inside no_sync() would accumulate. Run the micro-batches inside no_sync() first and the "
    "last one outside it, as with DDP.")

# The phase the heartbeats publish (world.registry.Activity): one assignment where it changes.
_activity = registry.activity

class Session(ElasticBinding, CompressedIntake, GradientHooks, Passthrough):
    # Made by `_bind` for the world of now: at wrap time, or in an elastic Horovod job at the
    # first step and again whenever that world was re-formed (Note [Elastic Horovod]).
    world: World
    sparse: SparseExchange
    engine: EngineHandle
    clock: StepClock
    lifecycle: PlanLifecycle

    def __init__(self, optimizer: torch.optim.Optimizer, base_cls: type[torch.optim.Optimizer],
                 named: list[tuple[str, torch.Tensor]], options: WrapOptions,
                 config: Config) -> None:
        release_orphans()
        self.config = config
        self.options = options
        self.elastic = elastic()
        if self.elastic and config.policy.overlaps_iterations:
            raise ValueError(f"commsched: policy '{config.policy.value}' applies updates in the "
                             "next forward pass, which an elastic Horovod job cannot restore "
                             "after losing a worker; use a synchronous policy (horovod, ddp, "
                             "mgwfbp, or auto, which then chooses among them)")
        if self.elastic and options.process_set is not None:
            raise ValueError("commsched: process_set= in an elastic Horovod job is not supported: "
                             "its ranks are re-numbered when the world is re-formed")
        if self.elastic and options.lossy is not None:
            raise ValueError("commsched: PowerSGD and top-k keep per-rank error-feedback state "
                             "that an elastic Horovod job cannot re-form after losing a worker; "
                             "use compression none, fp16 or bf16 there")
        self.iteration = 0
        self.passes = options.backward_passes_per_step
        # Whether gradients accumulated under no_sync() wait in p.grad, not yet handed over.
        self.held_back = False
        self._base_cls = base_cls
        self.names = {p: n for n, p in named}
        # Gradients that arrived sparse on a dense-planned parameter this iteration: reduced
        # dense, handed back sparse (Note [sparse gradients without a route]).
        self._densified: set[int] = set()
        routed_ids = sparse_parameter_ids(options.model, options.sparse_as_dense)
        self._routed = [(n, p) for n, p in named if p.requires_grad and id(p) in routed_ids]
        tracked = [(n, p) for n, p in named if p.requires_grad and id(p) not in routed_ids]
        self.params = [p for _, p in tracked]
        self.specs = make_specs(tracked, options.group_of)
        self.intake: _C.GradientIntake | None = None  # made below, after the first _bind()
        self.deferred = DeferredUpdates(base_cls, optimizer)
        self.runner: OverlapRunner | None = None
        self.compressed: CompressedGradients | None = None
        # Note [a dropped optimizer releases its engine] (runtime/release.py).
        self._resources = Resources(None, None, [], threading.get_ident())
        self._release = weakref.finalize(optimizer, release, self._resources)
        self._release.atexit = False  # at exit commsched.shutdown() stops what is left
        self._bound = False  # whether engine, plan and world exist (see _bind)
        if not self.elastic:
            self._bind()
        self.intake = _C.GradientIntake(len(self.params), self.passes, self._first_gradient_call(),
                                        self._slow_path())
        if self._bound:
            self.intake.set_engine(self.engine.native)
        compressed_ids: list[int] = [] if self.compressed is None else list(self.compressed.ids)
        for tid in compressed_ids:
            self.intake.set_python_only(tid, True)  # the compressor's hand-over is Python's
        self._hooks = self._gradient_hooks()
        self._hooked = len(self._hooks)  # dense gradients that reach the engine from a hook
        self._hooks += [p.register_post_accumulate_grad_hook(self._sparse_hook(i))
                        for i, (_, p) in enumerate(self._routed)]
        self._resources.hooks = self._hooks
        _activity.now = ("forward", time.monotonic(), self.iteration)

    def _bind(self) -> None:
        """Everything that needs the world: the checks across ranks, the engine and its first
        plan. All ranks call it together (at wrap time, or at the same step of an elastic job)."""
        config, options = self.config, self.options
        self.world = world_for(bootstrap.current(config.timeout, config.stall_warning),
                               options.process_set)
        # Output files are checked before any group or engine exists (nothing to undo).
        if config.profile and self.world.rank == 0:  # rank 0 writes it at the re-plan
            prepare_file(config.profile, "COMMSCHED_PROFILE")
        if config.timeline:
            prepare_file(timeline_path(config.timeline, self.world.rank), "COMMSCHED_TIMELINE")
        self.compressed = None if options.lossy is None else CompressedGradients(
            options.lossy, self.specs, self.params, self.world.size, self.world.rank)
        wire = [] if self.compressed is None else self.compressed.wire_specs
        self._check_ranks_agree(self._routed)
        self.sparse = SparseExchange(self.world, self._routed, options.op, self.passes)
        this = weakref.ref(self)  # the engine must not keep the session (and the optimizer) alive
        self.engine = EngineHandle(self.world, self.specs + wire, config.timeout, config.timeline,
                                   iteration=lambda: getattr(this(), "iteration", 0))
        self._resources.engine, self._resources.sparse = self.engine, self.sparse
        self._mark_ready = self.engine.mark_ready
        if self.intake is not None:  # an elastic job's (re)bind: gradients go to the new engine
            self.intake.set_engine(self.engine.native)
        self.runner = self._resources.runner = self._make_runner(self._base_cls)
        self.clock = StepClock(self.engine)
        postscale = options.predivide / self.world.size if options.op is ReduceOp.AVERAGE else 1.0
        self._lossy_scale = postscale / options.predivide  # the engine's pre- x post-scale
        if self.runner is not None:
            self.runner.compressed = self.compressed
            self.runner.decompress_scale = self._lossy_scale
        self.lifecycle = PlanLifecycle(self.world, config, self.specs, self.engine, self.runner,
                                       Scaling(options.compression, 1.0 / options.predivide,
                                               postscale))
        if self.elastic:  # a joining worker starts at 0: rank 0 holds the committed position
            self.iteration = int(self.world.broadcast_object(self.iteration))
        if self.compressed is not None:
            self.compressed.begin(self.engine)
            self._compression_switch()
        self.lifecycle.start(self.iteration)
        self._may_pass = self._passthrough_possible()
        self._bound = True

    def _reset_counts(self, next_iteration: bool = False) -> None:
        """Every tensor expects `passes` gradients again; with `next_iteration` the next
        gradient is also the iteration's first (Session._first_gradient runs)."""
        if self.intake is not None:
            if next_iteration:
                self.intake.next_iteration(self.passes)
            else:
                self.intake.reset(self.passes)
        if self._routed and self._bound:
            self.sparse.reset(self.passes)

    def _check_ranks_agree(self, routed: list[tuple[str, torch.Tensor]]) -> None:
        check_identical(self.world, "wrapped parameters (name, shape, dtype)",
                        parameter_signature(self.specs, [tuple(p.shape) for p in self.params]))
        o = self.options
        settings = {**self.config.as_dict(), "timeline": None,
                    "compression": o.compression.__name__, "op": o.op.name,
                    "lossy": None if o.lossy is None else repr(o.lossy),
                    "backward_passes_per_step": o.backward_passes_per_step,
                    "gradient_predivide_factor": o.predivide,
                    "groups": [s.group for s in self.specs],
                    "sparse": [[n, list(p.shape), str(p.dtype)] for n, p in routed],
                    "process_set": self.world.members}
        check_identical(self.world, "DistributedOptimizer settings", sorted(settings.items()))

    def _make_runner(self, base_cls: type) -> OverlapRunner | None:
        policy, model = self.config.policy, self.options.model
        if policy.overlaps_iterations:
            check_overlap_allowed(policy.value, model, base_cls)
        elif self.elastic or not (policy is Policy.AUTO and overlap_possible(model, base_cls)):
            return None  # an elastic job runs synchronous plans only (see __init__)
        return OverlapRunner(self.deferred, model, self.params, self.engine)

    @property
    def bound(self) -> bool:
        """Whether the engine and its plan exist (in an elastic job: from the first step)."""
        return self._bound

    @property
    def plan(self) -> Plan:
        if not self._bound:
            raise RuntimeError("commsched: in an elastic Horovod job the plan is made at the "
                               "first step, with the world of that step")
        return self.lifecycle.plan

    @property
    def defers_updates(self) -> bool:
        """Whether step() leaves the update to the next forward pass (an overlap plan runs)."""
        return self.runner is not None and self.runner.active

    @property
    def base_cls(self) -> type[torch.optim.Optimizer]:
        """The user's optimizer class (the wrapper's class derives from it)."""
        return self._base_cls

    # -- gradient hooks -----------------------------------------------------------------------

    def _first_gradient(self) -> None:
        """Once per iteration, at its first gradient: what must happen before any gradient is
        handed over. Later gradients of the iteration go straight to the engine."""
        if self.elastic and self.stale:
            self._elastic_guard(self._rebind)
        intake = self.intake
        assert intake is not None
        intake.started = True
        _activity.now = ("backward", time.monotonic(), self.iteration)
        if self.lifecycle.unsettled:
            self._elastic_guard(self.lifecycle.settle, self.iteration)
        runner = self.runner
        if runner is not None and runner.open:
            # No forward pass of `model` closed the previous iteration: do it now.
            runner.finish()
        if self.engine.sampling:  # the profiler keeps every few iterations only
            self.clock.first_gradient(runner.update_seconds_so_far() if runner is not None
                                      else 0.0)

    @property
    def pending(self) -> bool:
        """Whether some gradient of this iteration was handed over and not yet reduced."""
        handed = self.intake is not None and self.intake.handed > 0
        if handed or not self._routed or not self._bound:
            return handed  # no sparse gradient is routed, or none was counted (unbound)
        return self.sparse.pending(self.passes)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside leave their gradients in ``p.grad`` to accumulate and send
        nothing; the first backward outside hands over the sum (Note [Accumulating without
        sending], csrc/gradient_intake.cpp). Nested blocks are one block."""
        intake = self.intake
        if intake is None or intake.held or self.passthrough:
            yield
            return
        if self.pending:
            raise RuntimeError(_NO_SYNC_AFTER_SEND)
        intake.held = True
        try:
            yield
        finally:
            intake.held = False
            self.held_back = any(p.grad is not None for p in self.params) or \
                any(p.grad is not None for _, p in self._routed)

    def set_passes(self, passes: int) -> None:
        self.hook_gradients()  # the hooks count the passes
        self.passes = passes
        self._reset_counts()

    # -- the end of an iteration ----------------------------------------------------------------

    def _launch_rest(self) -> None:
        """Marks every gradient not produced on this rank as ready, as zeros (Horovod's rule:
        another rank may have computed it)."""
        if self.compressed is not None and self.compressed.on:
            self.compressed.launch_rest()
        if self.intake is not None and self.intake.marked == self._hooked:
            return  # every hooked gradient is with the engine (zero-size ones are in no block)
        for tensor_id in self.engine.not_ready():
            if tensor_id >= len(self.params):
                continue  # a compressor's wire tensor: released by the compressor
            param = self.params[tensor_id]
            if param.grad is None:
                self._lacked_gradient()
                param.grad = torch.zeros_like(param)
            elif param.grad.is_sparse:
                self._densify(tensor_id, param)
            self.engine.mark_ready(tensor_id, dense_layout(param))

    def synchronize(self) -> None:
        """Reduces every gradient into ``p.grad``; missing ones count as zeros, as in Horovod."""
        if self.passthrough:  # Note [A world of one steps as the plain optimizer]
            self.iteration += 1
            return
        if self.elastic and self.stale:  # no gradient in this iteration here; the world changed
            self._elastic_guard(self._rebind)
        _activity.now = ("step", time.monotonic(), self.iteration)
        self.flush()
        self._elastic_guard(self._reduce)

    def _reduce(self) -> None:
        if self.lifecycle.unsettled:
            self.lifecycle.settle(self.iteration)
        # _launch_rest's own first test, here: most iterations produce every gradient
        if self.intake is None or self.intake.marked != self._hooked or self.compressed is not None:
            self._launch_rest()
        # Under an overlap plan (synchronize() before a clipped or scaled step) DeAR's
        # all-gathers would wait for the next forward pass: every gradient is wanted now.
        self.engine.release_forward_blocks()
        compressed = self.compressed if self.compressed is not None and self.compressed.on \
            else None
        if compressed is not None:
            self._second_round(compressed)
        if self._routed:
            self.sparse.exchange()  # while the engine's thread reduces the dense blocks
        self.engine.wait()
        if compressed is not None:
            started = _C.now_us()
            compressed.finish(self._lossy_scale)
            self.engine.span("decompress", started)
            self.engine.profiler.note("compression_s", compressed.take_busy_s())
        if self._densified:
            self._resparsify()
        self._end_iteration()
        if self._may_pass:
            self._maybe_pass_through()

    def _second_round(self, compressed: CompressedGradients,
                      before_wait: Callable[[int], None] | None = None) -> None:
        """The compressor's second round (PowerSGD's Qs), on the timeline as one span."""
        started = _C.now_us()
        compressed.release_late(self.plan, before_wait)
        self.engine.span("compress", started, what="orthogonalise P, Q = M^T P")

    def step_deferred(self) -> None:
        """step() of an overlap plan: launch the rest and leave the update to the next forward."""
        runner = self.runner
        assert runner is not None
        _activity.now = ("step", time.monotonic(), self.iteration)
        if runner.open:  # no backward since the last step()
            runner.finish()
        if self.lifecycle.unsettled:
            self.lifecycle.settle(self.iteration)
        # _launch_rest's own first test, here: most iterations produce every gradient
        if self.intake is None or self.intake.marked != self._hooked or self.compressed is not None:
            self._launch_rest()
        runner.begin()
        compressed = self.compressed
        if compressed is not None and compressed.on:  # Note [Compression under an overlap plan]
            self._second_round(compressed, before_wait=runner.release_for)
            compressed.end_round()
            self.engine.profiler.note("compression_s", compressed.take_busy_s())
        # Sparse rows are few and updated now, at step(), while dense blocks are deferred.
        if self._routed:
            self.sparse.exchange()
            self.sparse.step_now(self.deferred)
        self._end_iteration()
        update_s = runner.take_update_seconds()
        if self.engine.sampling:
            self.engine.profiler.note("step_s", update_s)
        self.clock.step_ended()
        _activity.now = ("forward", time.monotonic(), self.iteration)
        if self._may_pass:
            self._maybe_pass_through()

    def update(self, step: Callable[[], Any], closure: Any) -> Any:
        """The user's optimizer step under a synchronous plan, timed for the profiler and the
        timeline. While an overlap plan may follow (profiling steps with a runner), the same
        update is made in two calls of different sizes instead, so that the profile can tell
        an optimizer call's fixed cost from its cost per byte (the planner's update groups
        trade the two)."""
        if self.passthrough:
            return step()
        started = _C.now_us()
        samples = []
        if closure is None and self.runner is not None and self.runner.recording:
            samples = self.deferred.step_all_in_two_calls()
        result = None if samples else step()
        self.clock.step_ended()
        self.engine.span("update", started)
        profiler = self.engine.profiler
        if self.engine.sampling or samples:
            profiler.note("step_s", (self.clock.step_end_us - started) / 1e6)
        for nbytes, seconds in samples:
            profiler.note_update(nbytes, seconds)
        _activity.now = ("forward", time.monotonic(), self.iteration)
        return result

    def skip_update(self) -> None:
        """The update after synchronize() that AMP's loss scaler skipped (an overflow): the
        iteration's traffic is over, no parameter or optimizer state changes, and the next
        forward pass begins as after any step."""
        if self.passthrough:
            return
        self.clock.step_ended()
        _activity.now = ("forward", time.monotonic(), self.iteration)

    def _end_iteration(self) -> None:
        self.held_back = False  # reduced with the iteration (handed over, or by _launch_rest)
        if self._routed:
            self._reset_counts(next_iteration=True)
        else:  # the common case in one call
            assert self.intake is not None
            self.intake.next_iteration(self.passes)
        self.iteration += 1
        if self.engine.timeline:
            self.engine.mark(f"iteration {self.iteration}")
        if self.compressed is not None:
            self._compression_switch()
        self.lifecycle.iteration_ended(self.iteration)

    def flush(self, pause: bool = False) -> None:
        """Applies every update still pending from cross-iteration overlap. `pause`: the user
        called it, and the training loop stops here (Note [A pause is not compute] in
        clock.py)."""
        if self.runner is not None:
            self.runner.finish()
        if pause and self._bound:  # unbound (an elastic job before its first step): no clock
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


