"""Which iterations the profiler records, and from when its window describes the plan that runs:
the plan lifecycle says whether its plan has settled, this decides the rest (Note [Sampling the
profile])."""

from __future__ import annotations

from ..engine.handle import EngineHandle

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
