"""Two planners compared apart from the noise between two candidates (Prophet against
ByteScheduler in the overlap benchmark).

Each commsched candidate plans from its own profile, measured under its own traffic and at its
own moments of the run, so two candidates whose planners agree on every profile still run
slightly different plans, and their medians differ by the run's noise (a few percent here, where
one step's time varies by more: the p10 and p90 columns of benchmarks/overlap/README.md). Two
figures separate the planners from that:

* both planners on the same profiles (every uncompressed overlap candidate's, as the run
  ended), simulated alike: they differ only where their rules do, and an identical plan says
  the rules coincide for that profile;
* the measured ratio paired by round: both candidates ran in every round, so the median of the
  per-round ratios is not moved by a slow phase of the machine that fell on one of them.

Where a member of the pair also runs as a control (Note [A control candidate] in
commsched/bench/candidate.py), the pair carries the member against its control, measured the same
ways: how far apart one candidate lands from itself in this job.
"""

from __future__ import annotations

import statistics
from typing import Any

from commsched.bench.candidate import CONTROL, is_control, parse_candidate
from commsched.config import Policy, load_config
from commsched.sim import FittedNetwork, profile_from_document
from commsched.sim.rank import PlanCache

from .resample import ratio_interval, round_series

# (challenger, baseline): Prophet is ByteScheduler's priority rule with blocks sized from the
# stepwise ready pattern (plan/prophet.py).
PAIRS = (("prophet", "bytescheduler"),)


def _candidates_of(labels: list[str], policy: str) -> list[str]:
    return [label for label in labels if label.startswith("commsched:")
            and not is_control(label) and parse_candidate(label)[0] == policy]


def pair_labels(labels: list[str], policy: str, baseline: str) -> tuple[str, str] | None:
    """The challenger's candidate (it must be the only one of its policy) and the baseline's
    with the same knobs, or the baseline's only candidate: a benchmark may run the baseline at
    several knobs (bench_overlap.sh's bytescheduler at 2 MiB and 1 MiB partitions), and the
    pair compares the planners, not the knobs."""
    firsts, seconds = _candidates_of(labels, policy), _candidates_of(labels, baseline)
    if len(firsts) != 1 or not seconds:
        return None
    knobs = parse_candidate(firsts[0])[1]
    same = [label for label in seconds if parse_candidate(label)[1] == knobs]
    if len(same) == 1:
        return firsts[0], same[0]
    return (firsts[0], seconds[0]) if len(seconds) == 1 else None


def planners_on_same_profiles(documents: list[dict], first: str, second: str,
                              allreduce_all_ms: float | None) -> dict[str, Any] | None:
    """`first`'s and `second`'s planners (commsched candidate labels, knobs included) on each
    document that can simulate an overlap plan, as validate.predict_ms simulates a candidate."""
    from .measured_vs_predicted import predict

    ratios, identical = [], 0
    for document in documents:
        run = profile_from_document(document)
        if not run.has_module_info:
            continue
        fitted = FittedNetwork.from_document(document)
        results, blocks = [], []
        for label in (first, second):
            policy, knobs = parse_candidate(label)
            cfg = load_config({**knobs, "policy": policy}, environ={})
            plan = PlanCache(run, cfg).plan(Policy(policy), {}, fitted)  # with update groups
            blocks.append([b.pieces for b in plan.blocks])
            results.append(predict(document, plan, Policy(policy),
                                   allreduce_all_ms=allreduce_all_ms))
        identical += blocks[0] == blocks[1]
        ratios.append(results[0].iteration_s / results[1].iteration_s)
    if not ratios:
        return None
    return {"profiles": len(ratios), "identical_plans": identical, "predicted_ratios": ratios}


def paired_ratio(rows: list[dict], first: str, second: str) -> float | None:
    """Median over rounds of `first`'s round median over `second`'s."""
    series = round_series(rows, [first, second], min_rounds=1)
    if series is None:
        return None
    return statistics.median(x / y for x, y in zip(series[first], series[second], strict=True))


def compare_pairs(labels: list[str], documents: list[dict], rows: list[dict],
                  allreduce_all_ms: float | None) -> list[dict[str, Any]]:
    """Every pair of PAIRS whose two policies are both candidates (pair_labels)."""
    out = []
    medians = {row["name"]: row["median_ms"] for row in rows}
    for policy, baseline in PAIRS:
        pair = pair_labels(labels, policy, baseline)
        if pair is None:
            continue
        first, second = pair
        entry: dict[str, Any] = {"first": first, "second": second,
                                 **measured_pair(rows, medians, first, second)}
        entry["same_profiles"] = planners_on_same_profiles(documents, first, second,
                                                           allreduce_all_ms)
        entry["controls"] = [{"label": label + CONTROL,
                              **measured_pair(rows, medians, label, label + CONTROL)}
                             for label in pair if label + CONTROL in medians]
        out.append(entry)
    return out


def measured_pair(rows: list[dict], medians: dict[str, float], first: str,
                  second: str) -> dict[str, Any]:
    """`first` against `second`: ratio of medians, paired by round, and the ratio's interval
    over resampled rounds."""
    entry: dict[str, Any] = {"measured_ratio": medians[first] / medians[second],
                             "paired_ratio": paired_ratio(rows, first, second)}
    series = round_series(rows, [first, second])
    if series is not None:  # Note [Resampling whole rounds] in resample.py
        entry["measured_ratio_interval"] = list(ratio_interval(series, first, second))
    return entry
