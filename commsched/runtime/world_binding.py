"""What a session makes for the world it runs in: the world, the engine and its plan lifecycle,
the sparse route, the compressor and the overlap runner. Made at wrap time, or in an elastic
Horovod job at the first step and again whenever that world was re-formed (Note [Elastic
Horovod] in world/bootstrap.py)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch

from ..config import Config, Policy
from ..ops import ReduceOp
from ..outputs import prepare_file
from ..plan import TensorSpec
from ..world import World, bootstrap
from ..world.process_sets import world_for
from .compression.gradients import CompressedGradients
from .compression.lossy_hook import LossyHook
from .deferred import DeferredUpdates
from .engine.handle import EngineHandle
from .engine.step_clock import StepClock
from .engine.timeline import timeline_path
from .intake.sparse_route import SparseExchange
from .iteration import IterationState
from .modes.overlap.module_profile import ModuleProfile
from .modes.overlap.runner import OverlapRunner, check_overlap_allowed, overlap_possible
from .modes.shard_state import ShardedState
from .planning.lifecycle import ModeFollower, PlanLifecycle, Scaling
from .release import Resources
from .wrap import WrapOptions, check_ranks_agree


class WorldBinding:
    """Held by a Session. `bind()` makes its parts and `start()` starts them; `stale` says when
    an elastic job needs them made again. Nothing here refers to the session (the engine reads
    its iteration through a weak reference)."""

    # Made by `bind` (read only while `bound`).
    formed: World
    world: World
    sparse: SparseExchange
    engine: EngineHandle
    clock: StepClock
    lifecycle: PlanLifecycle

    def __init__(self, config: Config, options: WrapOptions, elastic: bool,
                 specs: list[TensorSpec], params: list[torch.Tensor],
                 routed: list[tuple[str, torch.Tensor]], deferred: DeferredUpdates,
                 base_cls: type[torch.optim.Optimizer], resources: Resources,
                 modes: ModeFollower, state: IterationState) -> None:
        self.config, self.options, self.elastic = config, options, elastic
        self.specs, self.params, self.routed = specs, params, routed
        self.deferred, self.base_cls, self.resources = deferred, base_cls, resources
        self.modes = modes  # the session's: each bind hands it this world's overlap runner
        self.state = state  # the session's iteration state, which each lifecycle shares
        self.bound = False  # whether world, engine and plan exist
        # The forward order and module times the last runner recorded: an elastic job's runner,
        # made again at the first gradient of a re-formed world's iteration, after the forward.
        self.recorded: ModuleProfile | None = None
        self.compressed: CompressedGradients | None = None
        # Top-k's momentum correction, attached to each bind's compressor: the wrapped optimizer
        # (held weakly: it holds the session, which holds this) and whether the op averages.
        self.momentum_of: tuple[weakref.ref[torch.optim.Optimizer], bool] | None = None
        self.momentum_warned = False
        self.binds = 0  # how many times bind() ran: an elastic job's re-forms are the rest

    def bind(self, iteration: Callable[[], int], passes: int) -> None:
        """Everything that needs the world: the checks across ranks, the engine and its
        compressor and runner. All ranks call it together (at wrap time, or at the same step of
        an elastic job). `iteration` reads the session's counter, which the engine stamps."""
        config, options = self.config, self.options
        # The whole world, and the one this optimizer reduces in: the view of its process set
        # (read again in each world an elastic job forms: Note [Elastic Horovod and process
        # sets] in elastic_guard.py), or the whole world.
        self.formed = bootstrap.current(config.timeout, config.stall_warning)
        self.world = world = world_for(self.formed, options.process_set)
        # Output files are checked before any group or engine exists (nothing to undo).
        if config.profile and world.rank == 0:  # rank 0 writes it at the re-plan
            prepare_file(config.profile, "COMMSCHED_PROFILE")
        if config.timeline:
            prepare_file(timeline_path(config.timeline, world.rank), "COMMSCHED_TIMELINE")
        # Refused before the engine's group exists: a rank that raised and tore its group down
        # while a peer was still connecting to it failed that peer's connect ("Connection
        # closed by peer") instead of letting it raise the same error.
        if config.shard_optimizer and world.size > 1 and self.routed:
            raise ValueError(
                "commsched: shard_optimizer=True (COMMSCHED_SHARD_OPTIMIZER) does not run "
                f"with sparse gradients ({self.routed[0][0]!r}) yet: pass "
                "sparse_as_dense=True to reduce them as dense ones")
        self.compressed = None if options.lossy is None else CompressedGradients(
            options.lossy, self.specs, self.params, world.size, world.rank)
        self._correct_momentum()
        self.binds += 1
        wire = [] if self.compressed is None else self.compressed.wire_specs
        check_ranks_agree(world, config, options, self.specs, self.params, self.routed)
        self.sparse = SparseExchange(world, self.routed, options.op, passes)
        self.engine = EngineHandle(world, self.specs + wire, config.timeout, config.timeline,
                                   iteration=iteration)
        # Released with the session from here on, also if the runner is refused just below.
        self.resources.engine, self.resources.sparse = self.engine, self.sparse
        runner = self.resources.runner = self._make_runner()
        self.modes.bind(runner)
        self.clock = StepClock(self.engine)
        postscale = options.predivide / world.size if options.op is ReduceOp.AVERAGE else 1.0
        self.lifecycle = PlanLifecycle(world, config, self.specs, self.engine, self.modes,
                                       Scaling(options.compression, 1.0 / options.predivide,
                                               postscale), self.state)
        if self.compressed is not None:  # Note [Compression is a comm hook] in engine/handle.py
            # Scaled by the engine's pre- x post-scale, which top-k applies itself.
            self.engine.register_comm_hook(LossyHook(
                self.compressed, postscale / options.predivide, self.engine, self.lifecycle))
        if config.shard_optimizer and world.size > 1:
            self.lifecycle.sharded = ShardedState(self.base_cls, self.deferred.user, self.params,
                                                  world, postscale, self.engine)

    def correct_momentum(self, optimizer: torch.optim.Optimizer, average: bool) -> None:
        """Top-k under `optimizer`'s momentum gets DGC's correction
        (runtime/compression/dgc_momentum.py), in
        this world and in each one an elastic job re-forms."""
        self.momentum_of = (weakref.ref(optimizer), average)
        self._correct_momentum()

    def _correct_momentum(self) -> None:
        optimizer = None if self.momentum_of is None else self.momentum_of[0]()
        if self.compressed is None or optimizer is None or self.momentum_of is None:
            return
        with warnings.catch_warnings():
            if self.momentum_warned:  # where none applies, the first attach said so
                warnings.simplefilter("ignore")
            self.compressed.attach(optimizer, self.base_cls, average=self.momentum_of[1])
        self.momentum_warned = True

    def start(self, iteration: int) -> None:
        """After bind(), with the iteration the world agreed on: the compressor and the plan
        start there, and the parts are bound."""
        if self.compressed is not None:
            self.compressed.begin(self.engine)
            # Compressing from here on if the run is past the start step: the first plan
            # carries the wire tensors then (an elastic job's new world starts mid-run).
            self.compressed.restored_at(iteration, self.lifecycle)
        self.lifecycle.start(iteration)
        self.bound = True

    def _make_runner(self) -> OverlapRunner | None:
        policy, model = self.config.policy, self.options.model
        if policy.overlaps_iterations:
            check_overlap_allowed(policy.value, model, self.base_cls)
        elif not (policy is Policy.AUTO and overlap_possible(model, self.base_cls)):
            return None
        # An elastic job binds at an iteration's first gradient, after its forward pass.
        return OverlapRunner(self.deferred, model, self.params, self.engine, self.recorded,
                             mid_iteration=self.elastic)

    @property
    def stale(self) -> bool:
        """Whether the session must (re)bind before its next collective: never bound, or its
        world is broken or was re-formed (an elastic job only)."""
        return self.elastic and (not self.bound or bootstrap.outdated(self.formed))

    def unbind(self) -> None:
        """Stops the engine of a world that failed or changed (no wait: its collectives may
        have failed), and removes the overlap runner's hooks with what it still defers (Note
        [Elastic Horovod and deferred updates] in elastic_guard.py)."""
        if self.bound:
            self.engine.shutdown()
        runner = self.modes.unbind()
        if runner is not None:
            self.recorded = runner.modules
            self.resources.runner = None
        self.bound = False

