"""The overlap mode (cross-iteration): step() launches the rest and returns; the overlap runner
(runtime/modes/overlap/runner.py) applies each group's update in the next forward pass
(bytescheduler, prophet, dear, and `auto`'s choice of one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..base import ModeKind, StepRules
from ..synchronous import SynchronousMode

if TYPE_CHECKING:
    from .runner import OverlapRunner


class OverlapMode(SynchronousMode):
    kind = ModeKind.OVERLAP
    defers_updates = True

    @property
    def runner(self) -> OverlapRunner:
        runner = self.session.modes.runner
        assert runner is not None, "an overlap mode runs with the runner that applies it"
        return runner

    def first_gradient(self) -> None:
        session, runner = self.session, self.runner
        if runner.open:  # no forward pass of `model` closed the previous iteration: do it now
            runner.finish(after_forward=True)
        if session.engine.sampling:
            session.clock.first_gradient(runner.update_seconds_so_far())

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        if not protocol.reduces:  # after synchronize(): every gradient is final, update now
            return super().step(optimizer, protocol, synchronize, closure)
        if closure is not None:
            raise ValueError(f"commsched: policy '{self.session.config.policy.value}' defers "
                             "the update to the next forward pass and cannot run a closure")
        self.step_deferred()
        return None

    def step_deferred(self) -> None:
        """Launches the rest and leaves the update to the next forward pass. Its waits
        (PowerSGD's second round) may fail as synchronize()'s may: ElasticGuard.run."""
        self.session.guarded(self._step_deferred)

    def _shard_step(self) -> Callable[[Callable[[int], torch.Tensor]], float] | None:
        """What updates this rank's slices before the all-gathers go (the sharded variant's)."""
        return None

    def _step_deferred(self) -> None:
        session, runner = self.session, self.runner
        session.publish("step")
        session.vote.cast(session.state.iteration)  # where no gradient came in this iteration
        runner.finish()  # where no backward came since the last step(); else it holds nothing
        if session.state.restore_unchecked:
            session.lifecycle.check_restored(session.state.iteration)
        session.launch_rest()
        shard_step = self._shard_step()
        runner.gathers_parameters = shard_step is not None
        runner.begin(shard_step)
        session.engine.comm_hook.deferred_round(session.plan, runner.release_for)
        # Sparse rows are few and updated now, at step(), while dense blocks are deferred.
        if session.routed:
            session.sparse.exchange()
            session.sparse.step_now(session.deferred)
        if runner.guard.updates_at_step:  # a forward path that runs no hook: nothing pending
            runner.finish()
        session.end_iteration()
        update_s = runner.take_update_seconds()
        if session.engine.sampling:
            session.engine.profiler.note("step_s", update_s)
        session.clock.step_ended()
        session.publish("forward")
        session.end_of_step()

    def finish(self) -> None:
        self.runner.finish()
