"""Writes benchmarks/zoo/README.md, summary.json and summary.png from the zoo job's runs
(bench_jobs.ZOO): per architecture, hvd's iteration and how much of it waits, DDP, the best
commsched policy against hvd and the floor, the slowest, and `auto` against the fastest, each
against the zoo's targets.

    python -m benchmarks.harness.zoo_report benchmarks/zoo --command "scripts/bench_zoo.sh"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from .bench_jobs import ZOO_BATCH, ZOO_MODELS, results_section

COMMSCHED = "commsched:"
AUTO = "commsched:auto"
# The zoo's targets: the best policy within these of hvd and of the floor, none above SLOWEST
# of hvd, and `auto` within AUTO_VS_FASTEST of the fastest other commsched candidate.
BEST_VS_HVD, BEST_VS_FLOOR, SLOWEST, AUTO_VS_FASTEST = 0.90, 1.10, 1.05, 1.03


@dataclass(frozen=True)
class ArchitectureRow:
    """One architecture's run, reduced to what the targets read."""

    name: str
    kind: str
    link: str
    hvd_ms: float
    hvd_waits: float | None  # the fraction of hvd's iteration spent waiting on the link
    ddp_vs_hvd: float | None
    best: str
    best_vs_hvd: float
    best_vs_floor: float | None
    slowest: str
    slowest_vs_hvd: float
    auto_vs_hvd: float | None
    auto_vs_fastest: float | None  # against the fastest commsched candidate other than auto
    noise: float  # hvd's spread: (slowest - fastest) / median of its round medians
    cpu_busy: float | None

    def misses(self) -> list[str]:
        """The targets this architecture misses, as words."""
        out = []
        if self.best_vs_hvd > BEST_VS_HVD:
            out.append(f"best {self.best_vs_hvd:.3f}x hvd > {BEST_VS_HVD}")
        if self.best_vs_floor is not None and self.best_vs_floor > BEST_VS_FLOOR:
            out.append(f"best {self.best_vs_floor:.3f}x the floor > {BEST_VS_FLOOR}")
        if self.slowest_vs_hvd > SLOWEST:
            out.append(f"{self.slowest} {self.slowest_vs_hvd:.3f}x hvd > {SLOWEST}")
        if self.auto_vs_fastest is not None and self.auto_vs_fastest > AUTO_VS_FASTEST:
            out.append(f"auto {self.auto_vs_fastest:.3f}x the fastest > {AUTO_VS_FASTEST}")
        return out


def _spread(row: dict[str, Any]) -> float:
    medians = sorted(row["round_medians_ms"])
    if len(medians) < 2:
        return 0.0
    return (medians[-1] - medians[0]) / statistics.median(medians)


def architecture_row(name: str, document: dict[str, Any]) -> ArchitectureRow:
    """Reads one architecture's results.json (compare_predict's) into its row.

    Raises:
        ValueError: the run holds no hvd or no commsched candidate.
    """
    rows = {row["name"]: row for row in document["rows"]}
    if "hvd" not in rows or not any(n.startswith(COMMSCHED) for n in rows):
        raise ValueError(f"{name}: the run holds no hvd or no commsched candidate")
    bound = document["bound"]
    floor = bound.get("floor_ms")
    ours = {n: r for n, r in rows.items() if n.startswith(COMMSCHED)}
    best = min(ours.values(), key=lambda r: r["median_ms"])
    slowest = max(ours.values(), key=lambda r: r["median_ms"])
    others = [r for n, r in ours.items() if n != AUTO]
    auto = rows.get(AUTO)
    fastest_other = min(others, key=lambda r: r["median_ms"]) if others else None
    ddp = rows.get("torch-ddp")
    return ArchitectureRow(
        name=name, kind=ZOO_MODELS[name].kind if name in ZOO_MODELS else "",
        link=document["meta"].get("network", ""), hvd_ms=rows["hvd"]["median_ms"],
        hvd_waits=bound.get("hvd_waiting_fraction"),
        ddp_vs_hvd=None if ddp is None else ddp["vs_hvd"],
        best=best["name"], best_vs_hvd=best["vs_hvd"],
        best_vs_floor=None if floor is None else best["median_ms"] / floor,
        slowest=slowest["name"], slowest_vs_hvd=slowest["vs_hvd"],
        auto_vs_hvd=None if auto is None else auto["vs_hvd"],
        auto_vs_fastest=None if auto is None or fastest_other is None
        else auto["median_ms"] / fastest_other["median_ms"],
        noise=_spread(rows["hvd"]), cpu_busy=document["meta"].get("cpu_busy_timed"))


def _cell(value: float | None, fmt: str = "{:.3f}x") -> str:
    return "-" if value is None else fmt.format(value)


def summary_lines(rows: list[ArchitectureRow]) -> list[str]:
    """The zoo's table, one architecture per row, and the targets each misses."""
    lines = ["| architecture | link | hvd ms | hvd waits | DDP | best | vs hvd | vs floor | "
             "slowest | vs hvd | auto vs hvd | auto vs fastest | hvd spread | misses |",
             "|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r.name} ({r.kind}) | {r.link} | {r.hvd_ms:.0f} | "
            f"{_cell(r.hvd_waits, '{:.0%}')} | {_cell(r.ddp_vs_hvd)} | {r.best} | "
            f"{r.best_vs_hvd:.3f}x | {_cell(r.best_vs_floor)} | {r.slowest} | "
            f"{r.slowest_vs_hvd:.3f}x | {_cell(r.auto_vs_hvd)} | {_cell(r.auto_vs_fastest)} | "
            f"{r.noise:.0%} | {'; '.join(r.misses()) or 'none'} |")
    return lines


def _plot(rows: list[ArchitectureRow], documents: dict[str, dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    candidates = sorted({row["name"] for d in documents.values() for row in d["rows"]
                         if row["name"] not in ("hvd", "local (no comm)")})
    width = 0.8 / max(len(candidates), 1)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(names)), 4.5))
    for i, candidate in enumerate(candidates):
        values = [next((row["vs_hvd"] for row in documents[n]["rows"]
                        if row["name"] == candidate), float("nan")) for n in names]
        ax.bar([k + i * width for k in range(len(names))], values, width, label=candidate)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(BEST_VS_HVD, color="green", linestyle="--", linewidth=0.8)
    ax.axhline(SLOWEST, color="red", linestyle="--", linewidth=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(names))], names)
    ax.set_ylabel("median iteration / hvd's")
    ax.set_title("every candidate against hvd, 2 ranks, link where hvd waits about half")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Writes the zoo's report from the runs under ROOT.

    Args:
        argv: the command line (ROOT and --command); sys.argv's where None.

    Returns:
        0 once the report is written.
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root")
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    documents, rows = {}, []
    for name in [n for n in ZOO_MODELS if os.path.exists(os.path.join(args.root, n,
                                                                       "results.json"))]:
        with open(os.path.join(args.root, name, "results.json"), encoding="utf-8") as handle:
            documents[name] = json.load(handle)
        rows.append(architecture_row(name, documents[name]))
    with open(os.path.join(args.root, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump({"command": args.command, "rows": [asdict(r) for r in rows],
                   "targets": {"best_vs_hvd": BEST_VS_HVD, "best_vs_floor": BEST_VS_FLOOR,
                               "slowest_vs_hvd": SLOWEST, "auto_vs_fastest": AUTO_VS_FASTEST}},
                  handle, indent=1)
    _plot(rows, documents, os.path.join(args.root, "summary.png"))
    met = [r.name for r in rows if not r.misses()]
    lines = ["# The zoo: architectures nobody tuned for", "",
             f"Command: `{args.command}` (each architecture one `compare` job under "
             "`horovodrun -np 2 --gloo`, inside a network namespace whose loopback is shaped; "
             "scripts/netem.sh).", "",
             f"Every policy at its defaults, batch {ZOO_BATCH} per rank, SGD with momentum, "
             "reduced inputs. Median iteration time of the slowest rank; candidates interleaved "
             "round by round within each job, so each ratio is read against the `hvd` of its own "
             "job. `hvd spread` is the range of hvd's round medians over their median: a "
             "difference smaller than it is within this machine's noise. Each architecture's "
             "link is set so that hvd waits about half its iteration; `hvd waits` is what the run "
             "itself measured against `local (no comm)`.", "",
             f"Targets: best at most {BEST_VS_HVD}x hvd and {BEST_VS_FLOOR}x the floor, no "
             f"policy above {SLOWEST}x hvd, `auto` within {AUTO_VS_FASTEST - 1:.0%} of the "
             f"fastest. Met on every target: {', '.join(met) or 'none'} of {len(rows)}.", "",
             *summary_lines(rows), "", "![every candidate against hvd](summary.png)", ""]
    for name in documents:
        lines += [results_section(os.path.join(args.root, name, "results.md")), "",
                  f"![{name}]({name}/results.png)", ""]
    with open(os.path.join(args.root, "README.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
