"""The `auto` policy: after the profiling steps, simulate every plan valid for this wrapper and
install the fastest prediction; then compare the prediction with the measured iteration time,
re-plan once when they disagree, and measure the close runners-up before settling (Note
[Measuring the close calls] in auto/trials.py, which decides what is measured).

Every rank ranks the candidates from the same profile document (that of the rank the others
wait for, gathered by the caller), and
the ranking is deterministic, so every rank installs the same plan; the re-plan and trial
decisions are also taken from rank 0's measurements for the same reason.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from ....config import Config
from ....plan import Plan
from ....sim import Ranked
from .trials import (
    TRIAL_STEPS,
    measured_fastest,
    prefer_fewer_copies,
    prefer_synchronous,
    runners_up,
    trial_schedule,
)

if TYPE_CHECKING:
    from ....sim.compressed import CompressedRun

log = logging.getLogger("commsched")

# The rule: re-plan once if the measured median is off the prediction by more than 20%
# over 20 steps.
CHECK_STEPS = 20
TOLERANCE = 0.20

# Note [A window's first step pays for no traffic]
# A window is timed from the end of the step that installed its plan, and that install first
# completes what the plan before it had in flight (lifecycle.install: the overlap runner's
# finish()), untimed. So under an overlap plan the window's first step waits for no earlier
# iteration's traffic: its forward pass has no deferred update to wait for, while each later
# step waits for the one before it, and a synchronous plan's every step waits for its own.
# Counted, that step is the window's fastest by the traffic it skipped, and the window's median
# moves down by one rank, a bias towards every overlap plan: unshaped, 2 ranks, the built-in
# CNN, `auto`'s trial windows read bytescheduler 8 MiB faster than mgwfbp, and the benchmark's
# rounds, which leave out each round's first step for this reason (bench/compare.py), read the
# opposite order; `auto` kept bytescheduler in two runs of two and ended outside the benchmarks'
# tolerance of the fastest both times (figures: benchmarks/notes/README.md, 'A window's first
# step pays for no traffic'). So every window lets its first
# UNTIMED_STEPS steps pass untimed, under every plan alike (the choice's check too, whose first
# period also held the simulation of every candidate: the lifecycle re-plans after taking the
# time). In the next run (benchmarks/unshaped/README.md) `auto` kept mgwfbp and ran within the
# tolerance of the fastest.
UNTIMED_STEPS = 1


class Verdict(Enum):
    """What the caller does after a measured window."""

    KEEP = "keep"        # the installed plan stays; `auto` has decided
    REPLAN = "replan"    # the prediction was too far off: choose again from the profile
    INSTALL = "install"  # install `chosen` (a plan to measure, or the measured-fastest)
    # The trials start: plan their candidates again from the choice's window (Note [Trials of
    # steady plans]), then install `chosen`, the first of them.
    TRIALS = "trials"


@dataclass
class AutoState:
    """What `auto` chose and how the prediction held up (``optimizer.auto`` exposes it)."""

    choices: list[Ranked] = field(default_factory=list)
    predicted_s: float | None = None
    measured_s: float | None = None
    replanned: bool = False
    periods: list[float] = field(default_factory=list)
    # One entry per plan installed after the profiling steps: policy, knobs, predicted and
    # (after CHECK_STEPS) measured seconds, and why it ran ("choice", "trial", "kept").
    history: list[dict] = field(default_factory=list)
    trials: int = 2  # the `auto_trials` knob
    current: int = 0  # index into `choices` of the plan installed now
    window: int = CHECK_STEPS  # steps of the window being measured
    untimed: int = 0  # steps still to pass before the window's first timed one
    # Note [Measuring the close calls]: the trial windows still to run (indices into `choices`;
    # None: not drawn up yet) and each measured window's median per index.
    pending: list[int] | None = None
    windows: dict[int, list[float]] = field(default_factory=dict)
    # Note [Planning from the steady state] in lifecycle.py: whether the plan kept has been
    # planned again from its own iterations (`refining`: that re-plan is due).
    refined: bool = False
    refining: bool = False

    @property
    def chosen(self) -> Ranked | None:
        return self.choices[self.current] if self.choices else None

    def choose(self, document: dict, cfg: Config, overlap_allowed: bool,
               compressed: CompressedRun | None = None, shards: int = 1) -> Ranked:
        """`compressed`: the user's lossy compressor runs, and every candidate carries it;
        `shards` > 1: shard_optimizer runs, and every candidate is sharded (`auto` never
        compresses or shards on its own, nor drops what the user asked for)."""
        from ....plan.copies import copied_bytes
        from ....sim import FittedNetwork, profile_from_document, rank_candidates
        from ....sim.profile import specs_from_profile

        run = profile_from_document(document)
        ranked = prefer_synchronous(rank_candidates(run, FittedNetwork.from_document(document),
                                                    cfg, overlap_allowed, compressed, shards))
        specs = specs_from_profile(run if compressed is None else compressed.run)
        world = run.world_size or 1
        ranked = prefer_fewer_copies(ranked, lambda plan: copied_bytes(plan, specs, world))
        if not ranked:
            raise RuntimeError("commsched: policy 'auto' found no plan to simulate")
        self.start(ranked, cfg.auto_trials)
        log.info("commsched auto: predicted %.1f ms for %s %s (next: %s)",
                 1e3 * ranked[0].predicted_s, ranked[0].policy.value, ranked[0].knobs,
                 ", ".join(f"{r.policy.value} {1e3 * r.predicted_s:.1f} ms" for r in ranked[1:4]))
        return ranked[0]

    def start(self, ranked: list[Ranked], trials: int) -> None:
        """Installs `ranked[0]` as the choice to check, with no trial drawn up or measured yet
        (a re-plan starts over from its new ranking)."""
        self.choices, self.trials = ranked, trials
        self.pending, self.windows = None, {}
        self._move_to(0, "choice")

    def rewire(self) -> None:
        """The compressor's wire changed (top-k's next warm-up stage): every candidate's plan
        carried the old one, so the next choice starts over, with its one re-plan and its
        refinement still to come."""
        self.replanned, self.refined, self.refining = False, False, False

    def _move_to(self, index: int, why: str, measured_s: float | None = None,
                 window: int = CHECK_STEPS) -> None:
        """Makes `choices[index]` the installed plan, to be measured over `window` steps;
        `measured_s` given: already measured, so nothing is left to measure."""
        self.current, self.window = index, window
        self.untimed = UNTIMED_STEPS if measured_s is None else 0
        chosen = self.choices[index]
        self.predicted_s, self.measured_s = chosen.predicted_s, measured_s
        self.periods.clear()
        self.history.append({"policy": chosen.policy.value, "knobs": dict(chosen.knobs),
                             "predicted_s": chosen.predicted_s, "measured_s": measured_s,
                             "why": why})

    @property
    def deciding(self) -> bool:
        """True until the plan that stays is installed and measured (a caller timing steady
        iterations waits for this)."""
        return self.predicted_s is not None and self.measured_s is None

    @property
    def settled(self) -> bool:
        """True once the plan that stays runs as it will: decided, and planned again from its
        own iterations (a caller timing steady iterations waits for this)."""
        return not self.deciding and not self.refining

    def trial_candidates(self) -> list[int]:
        """Indices into `choices` of the plans the trials measure, the choice's included."""
        return sorted({0, self.current, *(self.pending or [])})

    def replan_trials(self, plans: dict[int, Plan]) -> None:
        """`plans`: each trial candidate's, with its knobs, from the choice's window (Note
        [Trials of steady plans])."""
        for index, plan in plans.items():
            self.choices[index] = dataclasses.replace(self.choices[index], plan=plan)

    def refine(self, plan: Plan) -> None:
        """`plan`: the kept policy's, with its knobs, made from the kept plan's own iterations."""
        self.choices[self.current] = dataclasses.replace(self.choices[self.current], plan=plan)
        self.refined, self.refining = True, False

    def record(self, period_s: float) -> bool:
        """Records one measured iteration after the choice; True when the window's steps are
        in and the caller should conclude (with rank 0's median, so that every rank decides
        alike). The window's first steps are not counted (Note [A window's first step pays for
        no traffic])."""
        if not self.deciding:
            return False
        if self.untimed:
            self.untimed -= 1
            return False
        self.periods.append(period_s)
        return len(self.periods) == self.window

    def local_median(self) -> float:
        return statistics.median(self.periods)

    def conclude(self, measured_s: float) -> Verdict:
        """Logs the window's median (rank 0's) and says what comes next: the one re-plan when
        the choice is more than TOLERANCE off its prediction, else the trials (their first
        window: TRIALS, later ones: INSTALL), else the measured-fastest plan (Note [Measuring
        the close calls])."""
        assert self.predicted_s is not None
        self.measured_s = measured_s
        self.history[-1]["measured_s"] = measured_s
        error = abs(measured_s - self.predicted_s) / self.predicted_s
        log.info("commsched auto: measured %.1f ms over %d steps, predicted %.1f ms (error %.0f%%)",
                 1e3 * measured_s, self.window, 1e3 * self.predicted_s, 100 * error)
        if not self.choices:  # restored from a checkpoint: the ranking was not saved
            return Verdict.KEEP
        if self.pending is None:  # the choice's check: not a trial window (the Note says why)
            if error > TOLERANCE and not self.replanned:
                self.replanned = True
                return Verdict.REPLAN
            self.pending = trial_schedule(runners_up(self.choices, self.trials))
            if not self.pending:
                return Verdict.KEEP  # nothing was close: the choice's own check stands
            self._move_to(self.pending.pop(0), "trial", window=TRIAL_STEPS)
            return Verdict.TRIALS
        self.windows.setdefault(self.current, []).append(measured_s)
        if self.pending:
            self._move_to(self.pending.pop(0), "trial", window=TRIAL_STEPS)
            return Verdict.INSTALL
        measured = {i: statistics.median(w) for i, w in self.windows.items()}
        best = measured_fastest(measured, leader=0)
        installed = best == self.current
        self._move_to(best, "kept", measured[best])
        log.info("commsched auto: keeps %s %s (%s)", self.choices[best].policy.value,
                 self.choices[best].knobs,
                 ", ".join(f"{self.choices[i].policy.value} {1e3 * t:.1f} ms"
                           for i, t in measured.items()))
        return Verdict.KEEP if installed else Verdict.INSTALL

    def summary(self) -> dict:
        chosen = self.chosen
        return {"policy": chosen.policy.value if chosen else None,
                "knobs": dict(chosen.knobs) if chosen else {},
                "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                "replanned": self.replanned, "history": [dict(h) for h in self.history],
                "ranking": [(r.policy.value, dict(r.knobs), r.predicted_s) for r in self.choices]}
