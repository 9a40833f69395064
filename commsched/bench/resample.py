"""How far a ratio that a report judges could move with the noise of the run: a bootstrap over
the job's rounds.

Note [Resampling whole rounds]
A report judges some ratios against a target (`auto` within 2% of the fastest candidate, prophet
within 2% of bytescheduler), and on this project's machines one step's time varies by 10-30%, so
a ratio of two medians moves by a few percent between runs of the same code. The report prints,
beside each judged ratio, the interval it covers in 90% of resampled runs: each draw picks the
job's rounds with replacement, the same rounds for every candidate (the candidates of a round ran
side by side, so a slow phase of the machine stays shared), and computes the ratio from each
candidate's median over the drawn rounds' medians (the overhead report: its best, the figure it
judges). An interval that straddles the target says that this run cannot tell whether the target
holds; the verdict itself stays the ratio the report measured. The interval is of the noise
between rounds only: an offset that lasts the whole run (two copies of one model placed
differently in memory, which the overhead report's control shows) is not in it.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence

DRAWS = 2000
LEVEL = 0.90
SEED = 0  # every report of the same rounds prints the same interval


def round_series(rows: Sequence[Mapping], names: Sequence[str], min_rounds: int = 2,
                 name_key: str = "name",
                 rounds_key: str = "round_medians_ms") -> dict[str, list[float]] | None:
    """Each named row's round medians (ms), or None when one is missing or the rows did not run
    the same rounds (at least `min_rounds`: resampling one round tells nothing)."""
    by_name = {row[name_key]: row.get(rounds_key) for row in rows}
    series = {name: list(by_name.get(name) or []) for name in names}
    lengths = {len(values) for values in series.values()}
    if len(lengths) != 1 or min(lengths) < max(min_rounds, 1):
        return None
    return series


def resampled(series: Mapping[str, Sequence[float]],
              statistic: Callable[[dict[str, float]], float],
              draws: int = DRAWS, seed: int = SEED,
              summary: Callable[[list[float]], float] = statistics.median) -> list[float]:
    """`statistic` of each draw's figures: each series' `summary` of the drawn rounds (Note
    [Resampling whole rounds])."""
    rounds = len(next(iter(series.values())))
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        picked = [rng.randrange(rounds) for _ in range(rounds)]
        out.append(statistic({name: summary([values[i] for i in picked])
                              for name, values in series.items()}))
    return out


def interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The central `level` of `values`."""
    ordered = sorted(values)
    tail = (1.0 - level) / 2
    last = len(ordered) - 1
    return ordered[round(tail * last)], ordered[round((1.0 - tail) * last)]


def share_at_most(values: Sequence[float], limit: float) -> float:
    return sum(value <= limit for value in values) / len(values)


def ratio_interval(series: Mapping[str, Sequence[float]], first: str,
                   second: str) -> tuple[float, float]:
    """The interval of `first`'s median over `second`'s across resampled rounds."""
    return interval(resampled(series, lambda medians: medians[first] / medians[second]))
