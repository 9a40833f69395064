"""The synchronous mode: step() reduces every gradient, waits, and runs the user's optimizer
(horovod, ddp, mgwfbp, the profiling steps, and `auto`'s choice of one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import ModeKind, StepMode, StepRules


class SynchronousMode(StepMode):
    """Also the skeleton of the other modes: what step() does when it is not to reduce (inside
    skip_synchronize(), or after synchronize()), which every mode but the sharded ones shares."""

    kind = ModeKind.SYNCHRONOUS

    def first_gradient(self) -> None:
        session = self.session
        if session.engine.sampling:  # the profiler keeps every few iterations only
            session.clock.first_gradient(0.0)

    def synchronize(self) -> None:
        session = self.session
        if session.elastic:  # no gradient in this iteration here; the world may change
            session.elastic_guard.rebind_if_stale(session.bind)
        session.publish("step")
        session.flush()
        session.guarded(session.reduce)

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        protocol.before_update(synchronize)
        return self.update(lambda: self.session.deferred.base_step(optimizer, closure), closure)

    def finish(self) -> None:
        """Nothing is pending: the update ran at step()."""

    def update(self, step: Callable[[], Any], closure: Any) -> Any:
        """Timed (StepClock.time_update); while the runner records the forward order, in two
        calls, as an overlap plan's groups would run it."""
        session = self.session
        runner = session.modes.runner
        recording = closure is None and runner is not None and runner.recording
        result = session.clock.time_update(
            step, session.deferred.step_all_in_two_calls if recording else None)
        session.publish("forward")
        return result

    def skip_update(self) -> None:
        """The iteration's traffic is over, no parameter or optimizer state changes, and the
        next forward pass begins as after any step."""
        self.session.clock.step_ended()
        self.session.publish("forward")
