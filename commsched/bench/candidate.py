"""One candidate of a side-by-side benchmark: how it steps, when each of its steps ended, and
how its label reads (`commsched:POLICY?knob=value&knob=value`, a control)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cpu_meter import CpuTally

LOCAL = "local (no comm)"

# Note [A control candidate]
# A label ending in CONTROL runs the same candidate a second time, on its own model copy and
# with its own profile, like the overhead benchmark's `plain (control)`: the two differ only by
# the run's noise and by what each one's profiling drew, so their distance is the smallest
# difference the job can tell from noise. A control counts for no comparison of policies.
CONTROL = "#control"


def is_control(label: str) -> bool:
    return label.endswith(CONTROL)


def parse_candidate(label: str) -> tuple[str, dict[str, Any]]:
    """'commsched:prophet?partition_bytes=1MiB&credit_bytes=2MiB' -> ('prophet', {...}); a
    control (Note [A control candidate]) parses as the candidate it repeats."""
    policy, _, query = label.removeprefix("commsched:").removesuffix(CONTROL).partition("?")
    knobs: dict[str, Any] = dict(item.split("=", 1) for item in query.split("&") if item)
    return policy, knobs


@dataclass
class Candidate:
    name: str
    step: Callable[[int], None]
    finish: Callable[[], None] = lambda: None  # lets pending work end before others run
    optimizer: Any = None
    predicted: bool = False  # a commsched candidate simulated from its profile (--predict)
    model: Any = None
    # Per round: when each step ended (perf_counter), the untimed first step included.
    ends: list[list[float]] = field(default_factory=list)
    # How busy the machine's cores were during this candidate's timed steps, over its rounds.
    cpu: CpuTally = field(default_factory=CpuTally)
