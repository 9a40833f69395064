"""One candidate of a side-by-side benchmark: how it steps, and when each of its steps ended."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOCAL = "local (no comm)"


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
