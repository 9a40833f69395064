"""The sharded modes (shard_optimizer, under a policy's plan: the profiling steps are not
sharded): each rank updates its slices between the reduce-scatters and the all-gathers, which
then carry parameters (runtime/modes/shard_state.py); under dear the all-gathers wait for the next
forward pass. The state moves to a new plan's slices at the first step() after its install
(Note [The sharded state follows the plan])."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .base import ModeKind, StepRules
from .overlap.mode import OverlapMode
from .synchronous import SynchronousMode

if TYPE_CHECKING:
    from .shard_state import ShardedState

SHARDED_STEP = (
    "commsched: with shard_optimizer=True, step() updates each rank's slices from the "
    "reduce-scatters and takes no closure and no skip_synchronize()")


def _follow_plan(sharded: ShardedState | None, protocol: StepRules, closure: Any
                 ) -> ShardedState:
    assert sharded is not None, "a sharded mode runs where the session shards"
    moved = sharded.follow_plan()
    assert moved, "a sharded mode runs a sharded plan"
    if not protocol.reduces or closure is not None:
        raise RuntimeError(SHARDED_STEP)
    return sharded


class ShardedMode(SynchronousMode):
    kind = ModeKind.SHARDED

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        session = self.session
        sharded = _follow_plan(session.sharded, protocol, closure)
        session.publish("step")
        session.reduce(sharded)
        session.publish("forward")
        return None


class ShardedOverlapMode(OverlapMode):
    kind = ModeKind.SHARDED_OVERLAP

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        _follow_plan(self.session.sharded, protocol, closure)
        self.step_deferred()
        return None

    def _shard_step(self) -> Callable[[Callable[[int], torch.Tensor]], float] | None:
        session = self.session
        assert session.sharded is not None
        return session.sharded.step_later(session.engine.reduced_shard)
