"""Turns the engine's timings into a Profile (ready times) and a NetModel (alpha, beta)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from .plan import NetModel, Profile

DEFAULT_NET = NetModel()


def fit_alpha_beta(samples: list[tuple[int, float]], fallback: NetModel = DEFAULT_NET) -> NetModel:
    """Least-squares fit of t = alpha + beta * bytes over (bytes, seconds) samples.

    Falls back to a proportional fit (alpha from the fallback) when the sizes do not spread, and
    clamps both terms at zero: a negative start-up or per-byte cost is measurement noise.
    """
    if not samples:
        return fallback
    xs = [float(n) for n, _ in samples]
    ys = [float(t) for _, t in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x <= 0 or len(set(xs)) < 2:
        alpha = min(fallback.alpha, min(ys))
        beta = max((mean_y - alpha) / mean_x, 0.0) if mean_x > 0 else fallback.beta
        return NetModel(alpha, beta)
    beta = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x
    beta = max(beta, 0.0)
    alpha = max(mean_y - beta * mean_x, 0.0)
    return NetModel(alpha, beta)


@dataclass
class Profiler:
    """Collects one record per finished iteration."""

    num_tensors: int
    ready_samples: list[list[float]] = field(default_factory=list)
    collective_samples: list[tuple[int, float]] = field(default_factory=list)

    def record(self, ready_us: Sequence[int], block_timings: Sequence[tuple[int, ...]]) -> None:
        marked = [t for t in ready_us if t >= 0]
        if marked:
            first = min(marked)
            self.ready_samples.append([(t - first) / 1e6 if t >= 0 else -1.0 for t in ready_us])
        for _block, nbytes, _ready, launch, done, service in block_timings:
            if launch >= 0 and done >= 0:
                self.collective_samples.append((nbytes, service / 1e6))

    @property
    def iterations(self) -> int:
        return len(self.ready_samples)

    def profile(self) -> Profile:
        """Median ready time per tensor over the recorded iterations; the first iteration is
        dropped when there are others (it includes one-off allocation and warm-up)."""
        rows = self.ready_samples[1:] if len(self.ready_samples) > 1 else self.ready_samples
        if not rows:
            return Profile()
        times = []
        for tensor in range(self.num_tensors):
            seen = [row[tensor] for row in rows if row[tensor] >= 0]
            times.append(statistics.median(seen) if seen else 0.0)
        return Profile(tuple(times))

    def net_model(self, alpha: float | None = None, beta: float | None = None) -> NetModel:
        fitted = fit_alpha_beta(self.collective_samples)
        return NetModel(fitted.alpha if alpha is None else alpha,
                        fitted.beta if beta is None else beta)
