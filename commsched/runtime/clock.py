"""The timing a session records besides the engine's own: the compute between the end of one
step() and the next iteration's first gradient (forward, loss, start of backward), which the
simulator needs and no hook measures directly."""

from __future__ import annotations

from .. import _C
from .engine import EngineHandle


class StepClock:
    def __init__(self, engine: EngineHandle) -> None:
        self._engine = engine
        self.step_end_us = -1
        self._waited_at_step_end = 0.0

    def step_ended(self) -> None:
        self.step_end_us = _C.now_us()
        self._waited_at_step_end = self._engine.waited_s

    def first_gradient(self) -> None:
        """At an iteration's first gradient: records the compute before backward, from the end
        of the last step() to now, minus the time the training thread spent waiting on the
        engine (overlap plans wait in the forward pass)."""
        if self.step_end_us < 0:
            return
        engine = self._engine
        elapsed = (_C.now_us() - self.step_end_us) / 1e6
        engine.profiler.note("before_first_ready_s",
                             max(elapsed - (engine.waited_s - self._waited_at_step_end), 0.0))
