"""Summarises a commsched timeline (COMMSCHED_TIMELINE, one rank's Chrome trace): per iteration
its length, the time the training thread waited on the engine and the collectives' bytes; then
each collective's median duration by message size, over the iterations after `--skip`.

With `--cycle TENSOR`, instead, one row per cycle after `--skip`, from one gradient of TENSOR
to the next: the link's busy and idle time (no collective in flight), how long the training
thread waited on the engine, its update calls (in all, and the longest one), and the link's
longest idle stretch with the time from its end to the next gradient.

    python scripts/timeline_summary.py /tmp/tl.rank0.json --skip 8 > summary.md
    python scripts/timeline_summary.py /tmp/tl.rank0.json --skip 8 --cycle classifier.0.weight
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from typing import Any

COLLECTIVES = ("reduce_scatter", "all_gather", "allreduce")


def _events(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        trace = json.load(handle)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def summary_lines(events: list[dict[str, Any]], skip: int) -> list[str]:
    """The two markdown tables (iterations, then collectives by size)."""
    spans = [e for e in events if e.get("ph") == "X"]
    marks = sorted(e["ts"] for e in events
                   if e.get("ph") == "i" and str(e.get("name", "")).startswith("iteration"))
    lines = ["| iteration | ms | waited on the engine, ms | collective MB |",
             "|---:|---:|---:|---:|"]
    for index, (start, end) in enumerate(zip(marks, marks[1:], strict=False), start=2):
        inside = [e for e in spans if start <= e["ts"] < end]
        waited = sum(e["dur"] for e in inside if e["name"] == "wait") / 1e3
        moved = sum(e["args"]["bytes"] for e in inside if e["name"] in COLLECTIVES) / 1e6
        lines.append(f"| {index} | {(end - start) / 1e3:.0f} | {waited:.0f} | {moved:.0f} |")
    since = marks[skip] if len(marks) > skip else 0
    lines += ["", f"From iteration {skip + 1} on: each collective's span (launch to completion, "
              "queueing behind earlier ones included) by message size.", "",
              "| collective | MB | count | median ms |", "|---|---:|---:|---:|"]
    for kind in COLLECTIVES:
        by_size: dict[int, list[float]] = collections.defaultdict(list)
        for e in spans:
            if e["name"] == kind and e["ts"] >= since:
                by_size[e["args"]["bytes"]].append(e["dur"] / 1e3)
        for size in sorted(by_size):
            lines.append(f"| {kind} | {size / 1e6:.3f} | {len(by_size[size])} | "
                         f"{statistics.median(by_size[size]):.1f} |")
    return lines


def _idle_stretches(spans: list[dict[str, Any]], start: float,
                    end: float) -> list[tuple[float, float]]:
    """The stretches between `start` and `end` with no collective in flight (µs), in order."""
    stretches, reach = [], start
    for x in sorted((x for x in spans if x["name"] in COLLECTIVES
                     and x["ts"] < end and x["ts"] + x["dur"] > start), key=lambda x: x["ts"]):
        if x["ts"] > reach:
            stretches.append((reach, x["ts"]))
        reach = max(reach, x["ts"] + x["dur"])
    if end > reach:
        stretches.append((reach, end))
    return stretches


def cycle_lines(events: list[dict[str, Any]], skip: int, tensor: str) -> list[str]:
    """The table of `--cycle`: one row per gradient-to-gradient cycle of `tensor`, with the
    link's longest idle stretch and how long after its end the next gradient became ready
    (0: the link idled until backward made one; above 0: the stretch ended on a gradient held
    from before it; below 0: it idled that long with one ready). Only gradients made during the
    stretch count: one held back from before it is not seen as ready."""
    spans = [e for e in events if e.get("ph") == "X"]
    readies = sorted(e["ts"] for e in events if e.get("name") == f"ready:{tensor}")[skip:]
    every_ready = sorted(e["ts"] for e in events
                         if e.get("ph") == "i" and str(e.get("name", "")).startswith("ready:"))
    lines = ["| cycle | ms | link busy ms | link idle ms | training thread waited ms "
             "| updates ms | longest update ms | longest link idle ms | its end to the next "
             "gradient ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for index, (start, end) in enumerate(zip(readies, readies[1:], strict=False), start=1):
        inside = [e for e in spans if start <= e["ts"] < end]
        waited = sum(e["dur"] for e in inside if e["name"] == "wait") / 1e3
        updates = [e["dur"] / 1e3 for e in inside if e["name"] == "update"]
        stretches = _idle_stretches(spans, start, end)
        busy = ((end - start) - sum(e - s for s, e in stretches)) / 1e3
        idle = max(stretches, key=lambda stretch: stretch[1] - stretch[0], default=(start, start))
        after = next((r for r in every_ready if r > idle[0]), end)
        lines.append(f"| {index} | {(end - start) / 1e3:.0f} | {busy:.0f} | "
                     f"{(end - start) / 1e3 - busy:.0f} | {waited:.0f} | {sum(updates):.0f} | "
                     f"{max(updates, default=0.0):.0f} | {(idle[1] - idle[0]) / 1e3:.0f} | "
                     f"{round((after - idle[1]) / 1e3)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("timeline")
    parser.add_argument("--skip", type=int, default=8, help="iterations left out of the sizes")
    parser.add_argument("--cycle", metavar="TENSOR",
                        help="one row per cycle from one gradient of TENSOR to the next")
    args = parser.parse_args()
    events = _events(args.timeline)
    lines = cycle_lines(events, args.skip, args.cycle) if args.cycle \
        else summary_lines(events, args.skip)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
