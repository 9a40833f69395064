"""The interface every step mode implements, and the names of the modes.

Note [A step mode is an object]
What step(), synchronize() and an iteration's first gradient do depends on the plan in place:
a synchronous plan reduces and then runs the user's optimizer; an overlap plan launches the rest
and leaves each update to the next forward pass; a sharded plan updates this rank's slices
between the reduce-scatters and the all-gathers; a world of one that has nothing left to learn
steps as the plain optimizer. Each is one class here, and the session holds one of them at a
time (StepModes.current, choice.py): the plan's lifecycle swaps it when it installs a plan, and
the session when a world of one passes through. No method asks which mode runs; a mode that
does not need a call does nothing in it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ...config import Config
    from ...plan import Plan
    from ..deferred import DeferredUpdates
    from ..elastic_guard import ElasticGuard
    from ..engine.handle import EngineHandle
    from ..engine.step_clock import StepClock
    from ..intake.gradient_intake import Accumulation, GradientHooks
    from ..intake.sparse_route import SparseExchange
    from ..iteration import IterationState
    from ..planning.lifecycle import PlanLifecycle
    from ..step_vote import NoVote, StepVote
    from .overlap.runner import OverlapRunner
    from .shard_state import ShardedState

class StepRules(Protocol):
    """Horovod's synchronize()/step() flags (commsched.optimizer.StepProtocol)."""

    @property
    def reduces(self) -> bool: ...
    def before_update(self, synchronize: Callable[[], None]) -> None: ...


class ModeSwitch(Protocol):
    """What a mode asks of the session's StepModes (choice.py)."""

    runner: OverlapRunner | None


class ModeSession(Protocol):
    """What the modes read of the session that holds them (runtime/session.py, which imports
    this package)."""

    state: IterationState
    config: Config
    deferred: DeferredUpdates
    params: list[torch.Tensor]
    routed: list[tuple[str, torch.Tensor]]
    accumulation: Accumulation
    hooks: GradientHooks
    elastic_guard: ElasticGuard
    # Runs a call that may fail as a collective does (ElasticGuard.run in an elastic job).
    guarded: Callable[..., None]
    vote: NoVote | StepVote

    @property
    def modes(self) -> ModeSwitch: ...
    @property
    def engine(self) -> EngineHandle: ...
    @property
    def clock(self) -> StepClock: ...
    @property
    def lifecycle(self) -> PlanLifecycle: ...
    @property
    def sparse(self) -> SparseExchange: ...
    @property
    def plan(self) -> Plan: ...
    @property
    def sharded(self) -> ShardedState | None: ...
    @property
    def elastic(self) -> bool: ...
    def bind(self) -> None: ...
    def flush(self, pause: bool = False) -> None: ...
    def reduce(self, sharded: ShardedState | None = None) -> None: ...
    def end_of_step(self) -> None: ...
    def publish(self, phase: str) -> None: ...
    def launch_rest(self) -> None: ...
    def end_iteration(self) -> None: ...


class ModeKind(enum.Enum):
    """Which step mode runs (StepMode.kind)."""

    SYNCHRONOUS = "synchronous"  # reduce, wait, then the user's optimizer (horovod, ddp, ...)
    OVERLAP = "overlap"  # updates in the next forward pass (bytescheduler, prophet, dear)
    SHARDED = "sharded"  # shard_optimizer: each rank updates its slices
    SHARDED_OVERLAP = "sharded_overlap"  # shard_optimizer under dear: the all-gathers deferred
    PLAIN = "plain"  # a world of one stepping as the plain optimizer


class StepMode:
    """One way of running an iteration's end (Note [A step mode is an object]). The interface
    only: SynchronousMode (synchronous.py) is the skeleton every other mode refines."""

    kind: ModeKind
    # Whether step() leaves the update to the next forward pass.
    defers_updates = False

    def __init__(self, session: ModeSession) -> None:
        self.session = session

    def first_gradient(self) -> None:
        """The mode's part of an iteration's first gradient (Session.first_gradient)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Reduces every gradient into ``p.grad``; missing ones count as zeros."""
        raise NotImplementedError

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        """DistributedOptimizer.step() without GradScaler: reduce where `protocol` says so (with
        `synchronize`, the wrapper's, which records it), then update.

        Returns:
            What the user's optimizer step returns, or None where the update is deferred.
        """
        raise NotImplementedError

    def update(self, step: Callable[[], Any], closure: Any) -> Any:
        """The user's optimizer step, after the gradients were reduced."""
        raise NotImplementedError

    def skip_update(self) -> None:
        """The update after synchronize() that AMP's loss scaler skipped (an overflow)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Applies every update the mode still holds (flush())."""
        raise NotImplementedError
