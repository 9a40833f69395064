"""What `python -m commsched report` shows: the markdown table, and the PNG of one iteration of
every rank, stacked, with the lanes of the timeline (compute, engine, network, training thread)
as horizontal bars."""

from __future__ import annotations

import statistics
from typing import Any

from .analysis import COLLECTIVES, RankTrace, window

# Lane rows, top to bottom, as the timeline numbers them (commsched/timeline.py LANES).
ROWS = [(3, "training thread"), (2, "network"), (1, "engine"), (0, "compute")]
COLOURS = {"allreduce": "tab:blue", "reduce_scatter": "tab:purple", "all_gather": "tab:cyan",
           "unpack": "tab:gray", "pack": "tab:olive", "wait": "tab:red", "update": "tab:green"}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def markdown(report: dict[str, Any]) -> str:
    link = report["link_bytes_per_s"]
    rows = ["| rank | iterations | iteration ms | overlap | compute idle | network idle | "
            "wire MB/iter | achieved Mbit/s | of link |", "|" + "---|" * 9]
    for r in report["ranks"]:
        achieved = r["achieved_bytes_per_s"]
        rows.append(f"| {r['rank']} | {r['iterations']} (skip {r['skip']}) | "
                    f"{1e3 * r['iteration_time_s']:.2f} | {_pct(r['overlap'])} | "
                    f"{_pct(r['compute_idle'])} | {_pct(r['network_idle'])} | "
                    f"{r['wire_bytes_per_iteration'] / 1e6:.3f} | "
                    f"{'-' if achieved is None else f'{8 * achieved / 1e6:.1f}'} | "
                    f"{_pct(r['link_utilisation'])} |")
    head = (f"{report['run_dir']}: {len(report['ranks'])} rank files, world size "
            f"{report['world_size']}, link "
            f"{'not given' if link is None else f'{8 * link / 1e6:.0f} Mbit/s per rank'}")
    return head + "\n\n" + "\n".join(rows)


def median_index(times: list[float]) -> int:
    """Index of the iteration whose length is the (lower) median: a real iteration, not an
    average of two."""
    target = statistics.median_low(times)
    return times.index(target)


def plot_iteration(traces: list[RankTrace], report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_rank = {r["rank"]: r for r in report["ranks"]}
    # The same iteration on every rank (ranks move in step through their collectives), chosen
    # as the median-length one on the first rank.
    index = median_index(by_rank[traces[0].rank]["iteration_times_s"])
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 1.0 + 1.6 * len(traces)), sharex=True,
                             squeeze=False)
    used: set[str] = set()
    for ax, trace in zip(axes[:, 0], traces, strict=True):
        iterations = window(trace, by_rank[trace.rank]["skip"])
        lo, hi = iterations[min(index, len(iterations) - 1)]
        for row, (lane, _) in enumerate(ROWS):
            bars: dict[str, list[tuple[float, float]]] = {}
            for span in trace.spans:
                if span.lane != lane or span.end <= lo or span.start >= hi:
                    continue
                start, end = max(span.start, lo), min(span.end, hi)
                # ms from the iteration's start; at least 0.3% wide so short spans show
                width = max((end - start) / 1e3, (hi - lo) / 1e3 * 0.003)
                bars.setdefault(span.name, []).append(((start - lo) / 1e3, width))
            # Collectives in flight together overlap: draw them as one translucent band each.
            for name, xs in bars.items():
                colour = COLOURS.get(name, "tab:brown")
                alpha = 0.5 if name in COLLECTIVES else 0.9
                ax.broken_barh(xs, (row - 0.35, 0.7), facecolors=colour, alpha=alpha)
                used.add(name)
            if lane == 0:
                ready = [(t - lo) / 1e3 for t in trace.ready if lo <= t < hi]
                ax.vlines(ready, row - 0.35, row + 0.35, colors="black", linewidth=0.8)
                if ready:
                    used.add("ready")
        ax.set_yticks(range(len(ROWS)), [label for _, label in ROWS], fontsize=8)
        ax.set_ylim(-0.6, len(ROWS) - 0.4)
        ax.set_title(f"rank {trace.rank}: iteration of {(hi - lo) / 1e3:.1f} ms "
                     f"(#{index + 1} of {len(iterations)} analysed)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from the iteration's start (its 'iteration N' mark)")
    handles = [Patch(color=COLOURS.get(n, "tab:brown"), alpha=0.5 if n in COLLECTIVES else 0.9,
                     label=n) for n in sorted(used - {"ready"})]
    if "ready" in used:
        handles.append(Patch(color="black", label="gradient ready"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=min(4, len(handles) or 1))
    fig.suptitle(f"{report['run_dir']}: one iteration per rank", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
