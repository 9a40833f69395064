"""The timing a session records besides the engine's own: the compute between the end of one
step() and the next iteration's first gradient (forward, loss, start of backward), which the
simulator needs and no hook measures directly; and the optimizer calls whose cost the planner's
update groups trade (UpdateTimer)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ... import _C
from .profiler import EventSpan

if TYPE_CHECKING:
    from .handle import EngineHandle


class UpdateTimer:
    """Times one call of the user's optimizer. On CUDA parameters the call only enqueues kernels
    on the current stream, so the host's clock would time the launches: the call is timed by
    CUDA events on that stream instead, read by the profiler once the device has passed them
    (Note [Which clock] in profiler.py). Elsewhere, the CPU clock. Given the stepped optimizer's
    `state`, it tells a call that made state for a parameter that had none (Note [A first call
    makes the optimizer's state])."""

    def __init__(self, params: Sequence[torch.Tensor],
                 state: Mapping[torch.Tensor, Any] | None = None) -> None:
        self._start: torch.cuda.Event | None = None
        self._started = 0.0
        self._state = state
        self._stateless = [p for p in params if not state.get(p)] if state is not None else []
        if params and params[0].is_cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> float | EventSpan:
        """Seconds on the CPU clock, or the event pair to read on the device."""
        if self._start is None:
            return time.perf_counter() - self._started
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return EventSpan(self._start, end)

    @property
    def made_state(self) -> bool:
        """After the call: whether it made state for a parameter that had none."""
        state = self._state
        return state is not None and any(state.get(p) for p in self._stateless)


# Note [A first call makes the optimizer's state]
# An optimizer's first step on a parameter makes its state (SGD's momentum buffer, Adam's two
# moments): memory the size of the parameter, written for the first time. That call takes
# several times as long as the ones after it, and the profiling steps' first calls span every
# parameter, the largest size the update samples hold: a least-squares line leans on it most.
# In the real models' benchmark jobs the fitted cost of one call over every byte came out at
# about twice the measured step (figures: benchmarks/notes/README.md, 'A first call makes the
# optimizer's state'). Such a call is not what the planner's update groups and the simulator
# need, the cost of the calls of every later iteration, so the profiler keeps such calls apart
# and fits them only where later calls of two sizes are missing (a world of one splits only
# its first step's update, Note [A world of one steps as the plain optimizer]). A call that
# makes no state (SGD without momentum) is a sample as any other.

# Note [A pause is not compute]
# The compute before an iteration's first gradient is timed from the end of the previous step(),
# which holds only forward, loss and the start of backward while training runs iteration after
# iteration. Where the training loop stops between two of them (an evaluation, a checkpoint, a
# benchmark's other candidates between its rounds), it holds the pause too: in a 2-rank run of
# the overlap benchmark's candidates, 1 sampled iteration in 15 had dozens of times the others'
# time there, on both ranks (figures: benchmarks/notes/README.md, 'A pause is not compute'). One
# such iteration moves a median of the 7 or 8 kept iterations a whole rank up. flush(), which
# such a loop calls to apply what is still deferred, marks the pause: the next iteration's
# compute before its first gradient is not measured, and its profiler row says so (-1), so the
# world's compute (world_profile.py) leaves it out. Only the user's own flush() does:
# synchronize() flushes within an iteration, and state_dict() is called by some loops every
# step, whose compute would then never be measured.


class StepClock:
    def __init__(self, engine: EngineHandle) -> None:
        self._engine = engine
        self._native = engine.native  # read at every step(), without a Python property
        self.step_end_us = -1
        self._waited_at_step_end = 0.0

    def step_ended(self) -> None:
        self.step_end_us = _C.now_us()
        self._waited_at_step_end = self._native.waited_us / 1e6

    def time_update(
            self, step: Callable[[], Any],
            in_two_calls: Callable[[], list[tuple[int, float | EventSpan, bool]]] | None) -> Any:
        """The user's optimizer step under a synchronous plan, timed for the profiler and the
        timeline. `in_two_calls`, while an overlap plan may follow (profiling steps with a
        runner), makes the same update in two calls of different sizes instead, so that the
        profile can tell an optimizer call's fixed cost from its cost per byte (the planner's
        update groups trade the two); it returns (bytes, seconds, made_state) per call."""
        engine = self._engine
        started = _C.now_us()
        samples = in_two_calls() if in_two_calls is not None else []
        result = None if samples else step()
        self.step_ended()
        engine.span("update", started)
        if engine.sampling or samples:
            engine.profiler.note("step_s", (self.step_end_us - started) / 1e6)
        for nbytes, seconds, made_state in samples:
            engine.profiler.note_update(nbytes, seconds, made_state)
        return result

    def time_sharded(self, step: Callable[[], float]) -> None:
        """A sharded step() (runtime/modes/shard_state.py): `step` returns the seconds its updates
        took,
        which the profile keeps as step_s; the rest of its span waited for reduce-scatters."""
        started = _C.now_us()
        busy_s = step()
        self.step_ended()
        self._engine.span("update", started)
        if self._engine.sampling:
            self._engine.profiler.note("step_s", busy_s)

    def pause(self) -> None:
        """Note [A pause is not compute]."""
        self.step_end_us = -1

    def first_gradient(self, updates_s: float = 0.0) -> None:
        """At an iteration's first gradient: records the compute before backward, from the end
        of the last step() to now, minus what an overlap plan does in the forward pass besides
        computing: the time the training thread spent waiting on the engine, and `updates_s`,
        the deferred updates applied meanwhile (the profile counts them in step_s already; in
        both places they would shift every gradient's window by the update time, and the
        simulator and the floor would charge the update twice)."""
        if self.step_end_us < 0:
            self._engine.profiler.no_compute_before()
            return
        engine = self._engine
        elapsed = (_C.now_us() - self.step_end_us) / 1e6
        waited = engine.waited_s - self._waited_at_step_end
        engine.profiler.note("before_first_ready_s", max(elapsed - waited - updates_s, 0.0))
