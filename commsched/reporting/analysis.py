"""`python -m commsched report RUN_DIR`: what a run's timelines (and profile) say about it.

RUN_DIR holds the per-rank timelines written with ``COMMSCHED_TIMELINE=RUN_DIR/timeline.json``
(``timeline.rank<N>.json``) and optionally ``profile.json`` (``COMMSCHED_PROFILE``). Per rank,
over the analysed iterations (iteration k runs from mark "iteration k-1" to mark "iteration k";
iteration 1 has no start mark and is never analysed):

* iteration time: median interval between consecutive "iteration N" marks.
* network busy: union of the collective spans (lane 2: allreduce, reduce_scatter, all_gather)
  clipped to the analysed window; network idle = 1 - busy / elapsed.
* compute idle: union of the training thread's "wait" spans (lane 3) / elapsed; compute busy =
  elapsed - waits.
* overlap fraction: share of network-busy time during which the training thread was not
  waiting, i.e. communication hidden behind compute (null without network time).
* wire bytes: what this rank sends in a ring: all-reduce of n bytes on p ranks 2(p-1)/p*n,
  reduce-scatter or all-gather (p-1)/p*n. The engine records a reduce-scatter's bytes as its
  output shard (n/p), an all-gather's as its full output. p is the profile's world_size, else the
  number of rank files. An iteration's collectives are found by round (see analysed_rounds).
* achieved bandwidth: the analysed iterations' wire bytes per second of those collectives' busy
  time; with ``--link`` (per rank) also achieved / link.

``--skip N`` ignores iterations 1..N; by default every iteration that began before the last
"plan" mark is skipped: the profiling steps and the step that re-planned (its broadcast and
profile writing are not training).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
NETWORK_LANE, TRAINING_LANE = 2, 3
_RANK_FILE = re.compile(r"^(?P<stem>.+)\.rank(?P<rank>\d+)\.json$")
_ITERATION = re.compile(r"^iteration \d+$")

Interval = tuple[float, float]


class ReportError(Exception):
    """A problem with one input, reported as a single line naming the file."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")


@dataclass
class Span:
    name: str
    lane: int
    start: float  # microseconds from the rank's timeline origin
    end: float
    args: dict[str, Any]


@dataclass
class RankTrace:
    rank: int
    path: str
    iterations: list[float] = field(default_factory=list)  # "iteration N" mark times, sorted
    plans: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)  # lane-0 gradient-ready marks
    spans: list[Span] = field(default_factory=list)


# -- intervals ------------------------------------------------------------------------------

def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted disjoint union: overlapping collectives (several in flight) count once."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clipped(spans: list[Span], lo: float, hi: float) -> list[Interval]:
    return merge([(max(s.start, lo), min(s.end, hi)) for s in spans])


# -- loading --------------------------------------------------------------------------------

def parse_trace_text(text: str, path: str) -> list[Any]:
    """The event list; a run that crashed leaves the array unclosed, maybe with a last event cut
    off mid-write: close it, and if that is not enough drop the last (partial) line."""
    stripped = text.strip()
    if not stripped:
        raise ReportError(path, "empty file")
    attempts = [stripped]
    if stripped.startswith("[") and not stripped.endswith("]"):
        attempts.append(stripped.rstrip(",") + "]")
        head = stripped.rpartition("\n")[0].rstrip().rstrip(",")
        attempts.append((head or "[") + "]")
    error: json.JSONDecodeError | None = None
    for attempt in attempts:
        try:
            doc = json.loads(attempt)
            break
        except json.JSONDecodeError as exc:
            error = error or exc
    else:
        assert error is not None
        raise ReportError(path, f"malformed JSON: {error.msg} at line {error.lineno} "
                                f"column {error.colno}")
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        doc = doc["traceEvents"]  # the object form of the trace format
    if not isinstance(doc, list):
        raise ReportError(path, "malformed trace: expected a JSON array of events")
    return doc


def load_rank(path: str, rank: int) -> RankTrace:
    try:
        with open(path, encoding="utf-8") as handle:
            events = parse_trace_text(handle.read(), path)
    except OSError as exc:
        raise ReportError(path, f"cannot read: {exc.strerror}") from exc
    trace = RankTrace(rank, path)
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("ts"), int | float):
            continue  # metadata ("M") events carry no time
        name, phase, ts = str(event.get("name", "")), event.get("ph"), float(event["ts"])
        if phase in ("i", "I"):
            if _ITERATION.match(name):
                trace.iterations.append(ts)
            elif name.startswith("plan "):
                trace.plans.append(ts)
            elif name.startswith("ready:"):
                trace.ready.append(ts)
        elif phase == "X" and isinstance(event.get("dur"), int | float) \
                and isinstance(event.get("tid", 0), int):
            args = event.get("args") if isinstance(event.get("args"), dict) else {}
            trace.spans.append(Span(name, event.get("tid", 0), ts, ts + float(event["dur"]),
                                    args or {}))
    trace.iterations.sort()
    trace.plans.sort()
    if not trace.iterations:
        raise ReportError(path, "no iteration marks (did the run finish a step with the "
                                "timeline on?)")
    return trace


def find_rank_files(run_dir: str) -> dict[int, str]:
    if not os.path.isdir(run_dir):
        raise ReportError(run_dir, "no such directory")
    by_stem: dict[str, dict[int, str]] = {}
    for name in sorted(os.listdir(run_dir)):
        match = _RANK_FILE.match(name)
        if match:
            by_stem.setdefault(match["stem"], {})[int(match["rank"])] = os.path.join(run_dir, name)
    if not by_stem:
        raise ReportError(run_dir, "no timeline files (timeline.rank<N>.json, written with "
                                   "COMMSCHED_TIMELINE=RUN_DIR/timeline.json)")
    return dict(sorted(by_stem.get("timeline", by_stem[min(by_stem)]).items()))


def load_profile(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ReportError(path, f"malformed JSON: {exc.msg} at line {exc.lineno}") from exc
    except OSError as exc:
        raise ReportError(path, f"cannot read: {exc.strerror}") from exc
    if not isinstance(doc, dict):
        raise ReportError(path, "malformed profile: expected a JSON object")
    return doc


# -- analysis -------------------------------------------------------------------------------

def wire_bytes(op: str, recorded: float, world: int) -> float:
    """Bytes one rank sends for a ring collective whose span recorded `recorded` bytes."""
    if op == "allreduce":
        return 2 * (world - 1) / world * recorded
    if op == "reduce_scatter":
        return (world - 1) * recorded  # recorded = the shard, n/p
    return (world - 1) / world * recorded  # all_gather: recorded = the full output


def default_skip(trace: RankTrace) -> int:
    """Iterations that began before the last plan mark (iteration 1 begins at start-up)."""
    if not trace.plans:
        return 0
    return 1 + sum(1 for ts in trace.iterations if ts < trace.plans[-1])


def window(trace: RankTrace, skip: int) -> list[Interval]:
    """The analysed iterations as (start, end) in the rank's microseconds."""
    marks = trace.iterations[max(skip, 1) - 1:]
    if len(marks) < 2:
        raise ReportError(trace.path, f"no iteration left to analyse after skipping {skip} "
                                      f"({len(trace.iterations)} iteration marks); try --skip 0")
    return list(zip(marks, marks[1:], strict=False))


def split_rounds(collectives: list[Span]) -> list[list[Span]]:
    """One round per iteration: the engine launches every block of the plan once per iteration,
    in plan order, so a block id seen again starts the next iteration's round."""
    rounds: list[list[Span]] = []
    seen: set[Any] = set()
    for span in sorted(collectives, key=lambda s: s.start):
        block = span.args.get("block")
        if not rounds or block in seen:
            rounds.append([])
            seen = set()
        rounds[-1].append(span)
        seen.add(block)
    return rounds


def analysed_rounds(collectives: list[Span], first: int,
                    iterations: list[Interval]) -> list[list[Span]]:
    """The collectives of each analysed iteration. With overlap policies an iteration's
    collectives straddle its end mark, so they are counted by round (the k-th round belongs to
    iteration k), not by where they fall in time; traces without block ids fall back to time."""
    if collectives and all("block" in s.args for s in collectives):
        return split_rounds(collectives)[first:first + len(iterations)]
    return [[s for s in collectives if lo <= s.start < hi] for lo, hi in iterations]


def analyse_rank(trace: RankTrace, world: int, skip: int | None,
                 link: float | None) -> dict[str, Any]:
    used_skip = default_skip(trace) if skip is None else skip
    iterations = window(trace, used_skip)
    lo, hi = iterations[0][0], iterations[-1][1]
    elapsed_s = (hi - lo) / 1e6
    collectives = [s for s in trace.spans if s.lane == NETWORK_LANE and s.name in COLLECTIVES]
    waits = [s for s in trace.spans if s.lane == TRAINING_LANE and s.name == "wait"]
    busy = clipped(collectives, lo, hi)
    waiting = clipped(waits, lo, hi)
    busy_s, wait_s = total(busy) / 1e6, total(waiting) / 1e6
    hidden_s = busy_s - total(intersect(busy, waiting)) / 1e6
    rounds = analysed_rounds(collectives, max(used_skip, 1), iterations)
    spans = [s for r in rounds for s in r]
    sent = sum(wire_bytes(str(s.args.get("op", s.name)), float(s.args.get("bytes", 0)), world)
               for s in spans)
    # Bandwidth over these collectives' own busy time, wherever it falls: an overlapped
    # iteration's tail runs past the window's end.
    own_busy_s = total(merge([(s.start, s.end) for s in spans])) / 1e6
    achieved = sent / own_busy_s if own_busy_s > 0 else None
    times = [(end - start) / 1e6 for start, end in iterations]
    return {
        "rank": trace.rank, "file": trace.path, "skip": used_skip, "iterations": len(iterations),
        "iteration_time_s": statistics.median(times), "iteration_times_s": times,
        "elapsed_s": elapsed_s,
        "network_busy_s": busy_s, "network_idle": 1 - busy_s / elapsed_s,
        "wait_s": wait_s, "compute_busy_s": elapsed_s - wait_s, "compute_idle": wait_s / elapsed_s,
        "overlap": hidden_s / busy_s if busy_s > 0 else None,
        "collectives_per_iteration": len(spans) / len(rounds) if rounds else 0.0,
        "wire_bytes_per_iteration": sent / len(rounds) if rounds else 0.0,
        "achieved_bytes_per_s": achieved,
        "link_utilisation": achieved / link if achieved is not None and link else None,
    }


# -- command --------------------------------------------------------------------------------

def build_report(run_dir: str, skip: int | None,
                 link: float | None) -> tuple[dict[str, Any], list[RankTrace]]:
    files = find_rank_files(run_dir)
    traces = [load_rank(path, rank) for rank, path in files.items()]
    profile = load_profile(os.path.join(run_dir, "profile.json"))
    world = len(files)
    if profile is not None and isinstance(profile.get("world_size"), int) \
            and profile["world_size"] > 0:
        world = profile["world_size"]
    report: dict[str, Any] = {"run_dir": run_dir, "world_size": world, "link_bytes_per_s": link,
                              "ranks": [analyse_rank(t, world, skip, link) for t in traces]}
    if profile is not None:
        tensors = profile.get("tensors") or []
        report["gradient_bytes"] = sum(int(t.get("bytes", 0)) for t in tensors
                                       if isinstance(t, dict))
    return report, traces
