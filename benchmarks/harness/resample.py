"""How far a ratio that a report judges could move with the noise of the run: a bootstrap over
the job's rounds.

Note [Resampling whole rounds]
A report judges some ratios against a target (`auto` within 2% of the fastest candidate, prophet
within 2% of bytescheduler), and on this project's machines one step's time varies by several
times that (the p10 and p90 columns of the reports under benchmarks/), so a ratio of two medians
moves by a few percent between runs of the same code. The report prints,
beside each judged ratio, the interval it covers in 90% of resampled runs: each draw picks the
job's rounds with replacement, the same rounds for every candidate (the candidates of a round ran
side by side, so a slow phase of the machine stays shared), and computes the ratio from each
candidate's median over the drawn rounds' medians (the overhead report: its best, the figure it
judges). An interval that straddles the target says that this run cannot tell whether the target
holds; the verdict itself stays the ratio the report measured. The interval is of the noise
between rounds only: an offset that lasts the whole run (two copies of one model placed
differently in memory, which the overhead report's control shows) is not in it.

Note [Resampling builds]
Where the rounds come from several builds of the candidates (the overhead benchmark's
`--instances`), each build's rounds share that build's copies, and so their offsets: drawing
rounds as if alike would treat four builds' 24 rounds as 24 independent ones, and the interval
would leave out how far the builds differ, the very offset the builds are there to show. So a
draw picks builds with replacement first, then within each picked build its rounds with
replacement (a two-stage, or cluster, bootstrap): with one build this is the draw above,
unchanged, and with several the interval widens by what the builds disagree on.
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
              summary: Callable[[list[float]], float] = statistics.median,
              builds: int = 1) -> list[float]:
    """`statistic` of each draw's figures: each series' `summary` of the drawn rounds (Note
    [Resampling whole rounds]); with `builds` > 1 the series are that many builds' rounds, one
    build after another, drawn by build first (Note [Resampling builds])."""
    rounds = len(next(iter(series.values())))
    if builds < 1 or rounds % builds:
        raise ValueError(f"{rounds} rounds are not {builds} builds' equal shares")
    per_build = rounds // builds
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        if builds == 1:  # the same stream of draws as before builds existed: reports repeat
            picked = [rng.randrange(rounds) for _ in range(rounds)]
        else:
            starts = [per_build * rng.randrange(builds) for _ in range(builds)]
            picked = [start + rng.randrange(per_build) for start in starts
                      for _ in range(per_build)]
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
