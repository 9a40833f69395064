"""The `auto` policy: after the profiling steps, simulate every plan valid for this wrapper and
install the fastest prediction; then compare the prediction with the measured iteration time
and re-plan once when they disagree.

Every rank ranks the candidates from the same profile document (that of the rank the others
wait for, gathered by the caller), and
the ranking is deterministic, so every rank installs the same plan; the re-plan decision is
also taken from rank 0's measurements for the same reason.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import Config
from ..sim import Ranked

if TYPE_CHECKING:
    from ..sim.compressed import CompressedRun

log = logging.getLogger("commsched")

# The rule: re-plan once if the measured median is off the prediction by more than 20%
# over 20 steps.
CHECK_STEPS = 20
TOLERANCE = 0.20

# Note [Overlap must win by a margin]
# A cross-iteration plan costs what the simulator does not charge: on the CPU its collectives'
# copies and reductions run on the cores the next forward pass computes on, and the runner's
# bookkeeping (taking the gradients out at step(), a hook and an optimizer call per group) comes
# on top of the update. Unshaped, 2 ranks, the built-in CNN: `auto` picked prophet for a predicted
# 29.7 ms against horovod's 30.5 (2.7% ahead); prophet measured 38.7 ms and horovod 35.3. And
# the simulator's own median error is about 4% (benchmarks/sim_validation). So an overlap plan
# is installed only when it is predicted faster than the best synchronous plan by more than
# OVERLAP_MARGIN; otherwise the synchronous plan, which also keeps Horovod's semantics (the
# parameters are final when step() returns). Where overlap pays (a shaped link), its predicted
# gain is 15-20% and far above the margin.
OVERLAP_MARGIN = 0.05


def prefer_synchronous(ranked: list[Ranked], margin: float = OVERLAP_MARGIN) -> list[Ranked]:
    """`ranked` (fastest prediction first) with the best synchronous candidate moved to the
    front when the leading overlap candidate is not predicted faster than it by more than
    `margin` (Note [Overlap must win by a margin])."""
    if not ranked or not ranked[0].policy.overlaps_iterations:
        return ranked
    sync = next((r for r in ranked if not r.policy.overlaps_iterations), None)
    if sync is None or sync.predicted_s > ranked[0].predicted_s * (1.0 + margin):
        return ranked
    return [sync] + [r for r in ranked if r is not sync]


@dataclass
class AutoState:
    """What `auto` chose and how the prediction held up (``optimizer.auto`` exposes it)."""

    choices: list[Ranked] = field(default_factory=list)
    predicted_s: float | None = None
    measured_s: float | None = None
    replanned: bool = False
    periods: list[float] = field(default_factory=list)
    # One entry per choice: policy, knobs, predicted and (after CHECK_STEPS) measured seconds.
    history: list[dict] = field(default_factory=list)

    @property
    def chosen(self) -> Ranked | None:
        return self.choices[0] if self.choices else None

    def choose(self, document: dict, cfg: Config, overlap_allowed: bool,
               compressed: CompressedRun | None = None) -> Ranked:
        """`compressed`: the user's lossy compressor runs, and every candidate carries it
        (`auto` never compresses on its own, nor drops what the user asked for)."""
        from ..sim import FittedNetwork, profile_from_document, rank_candidates

        run = profile_from_document(document)
        ranked = prefer_synchronous(rank_candidates(run, FittedNetwork.from_document(document),
                                                    cfg, overlap_allowed, compressed))
        if not ranked:
            raise RuntimeError("commsched: policy 'auto' found no plan to simulate")
        self.choices = ranked
        self.predicted_s = ranked[0].predicted_s
        self.measured_s = None
        self.periods.clear()
        self.history.append({"policy": ranked[0].policy.value, "knobs": dict(ranked[0].knobs),
                             "predicted_s": ranked[0].predicted_s, "measured_s": None})
        log.info("commsched auto: predicted %.1f ms for %s %s (next: %s)",
                 1e3 * ranked[0].predicted_s, ranked[0].policy.value, ranked[0].knobs,
                 ", ".join(f"{r.policy.value} {1e3 * r.predicted_s:.1f} ms" for r in ranked[1:4]))
        return ranked[0]

    def record(self, period_s: float) -> bool:
        """Records one measured iteration after the choice; True when CHECK_STEPS are in and
        the caller should conclude (with rank 0's median, so that every rank decides alike)."""
        if self.predicted_s is None or self.measured_s is not None:
            return False
        self.periods.append(period_s)
        return len(self.periods) == CHECK_STEPS

    def local_median(self) -> float:
        return statistics.median(self.periods)

    def conclude(self, measured_s: float) -> bool:
        """Logs the measurement; True if it calls for the one re-plan."""
        assert self.predicted_s is not None
        self.measured_s = measured_s
        self.history[-1]["measured_s"] = measured_s
        error = abs(measured_s - self.predicted_s) / self.predicted_s
        log.info("commsched auto: measured %.1f ms over %d steps, predicted %.1f ms (error %.0f%%)",
                 1e3 * measured_s, CHECK_STEPS, 1e3 * self.predicted_s, 100 * error)
        if error <= TOLERANCE or self.replanned:
            return False
        self.replanned = True
        return True

    def summary(self) -> dict:
        chosen = self.chosen
        return {"policy": chosen.policy.value if chosen else None,
                "knobs": dict(chosen.knobs) if chosen else {},
                "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                "replanned": self.replanned, "history": [dict(h) for h in self.history],
                "ranking": [(r.policy.value, dict(r.knobs), r.predicted_s) for r in self.choices]}
