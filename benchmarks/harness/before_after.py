"""The report of scripts/bench_before_after.sh: a refactoring's cost, the code at a base commit
against the checkout, measured in one job with the two alternating.

    python -m benchmarks.harness.before_after --out DIR --base SHA --rounds N --rate RATE
        --command "..."

Reads DIR/{base,head}-<round>/{calls.md,overhead/results.json,cnn/results.json} and writes
DIR/{README.md,results.json,results.png}. Each timing is read against a control run in the same
process or job: the overhead benchmark's candidates over its plain optimizer, the CNN's over
torch DDP. A side is slower beyond noise where its median ratio exceeds the other's by more
than the spread of that ratio between the rounds of one side.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
from typing import Any

SIDES = ("base", "head")


def _calls(path: pathlib.Path) -> dict[str, tuple[float, float]]:
    """'model policy' -> (Python calls per iteration, of them in commsched)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"[\d.]+", cells[2]):
            found[f"{cells[0]} {cells[1]}"] = (float(cells[2]), float(cells[3]))
    return found


def _overhead(path: pathlib.Path) -> dict[str, float]:
    """'model candidate' -> best median over the plain optimizer's, in that run."""
    ratios = {}
    for result in json.loads(path.read_text(encoding="utf-8"))["results"]:
        rows = {r["candidate"]: r["best_median_ms"] for r in result["rows"]}
        for name, ms in rows.items():
            if name != "plain":
                ratios[f"{result['model']} {name}"] = ms / rows["plain"]
    return ratios


def _cnn(path: pathlib.Path) -> dict[str, float]:
    """candidate -> median iteration time over torch DDP's, in that job."""
    rows = {r["name"]: r["median_ms"] for r in json.loads(path.read_text(encoding="utf-8"))["rows"]}
    return {f"cnn 2 ranks {name}": ms / rows["torch-ddp"] for name, ms in rows.items()
            if name != "torch-ddp"}


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


def summarise(out: pathlib.Path, rounds: int) -> dict[str, Any]:
    calls = {side: _calls(out / f"{side}-1" / "calls.md") for side in SIDES}
    timed: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    for side in SIDES:
        for r in range(1, rounds + 1):
            run = out / f"{side}-{r}"
            for key, value in {**_overhead(run / "overhead" / "results.json"),
                               **_cnn(run / "cnn" / "results.json")}.items():
                timed[side].setdefault(key, []).append(value)
    rows = []
    for key in timed["head"]:
        base, head = timed["base"][key], timed["head"][key]
        noise = max(_spread(base), _spread(head))
        change = statistics.median(head) - statistics.median(base)
        rows.append({"measure": key, "base": base, "head": head,
                     "base_median": statistics.median(base),
                     "head_median": statistics.median(head), "noise": noise,
                     "slower_beyond_noise": change > noise})
    return {"calls": {k: {side: calls[side].get(k) for side in SIDES} for k in calls["head"]},
            "timed": rows}


def render(out: pathlib.Path, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    lines = [f"# Before and after: {meta['base']} against the checkout", "",
             f"Command: `{meta['command']}`", "",
             f"One job: the two versions alternate, {meta['rounds']} runs each; the CNN runs on 2 "
             f"ranks (`horovodrun --gloo`) on a loopback shaped to {meta['rate']}, the world of "
             "one in one process per run. Each timing is a ratio over the control of its own "
             "run (the plain optimizer; torch DDP), and a change counts as slower only beyond "
             "the spread of that ratio between one side's runs.", "",
             "## Python calls per iteration (a world of one keeping the engine)", "",
             "| model policy | base: all | base: commsched | head: all | head: commsched |",
             "|---|---:|---:|---:|---:|"]
    for key, sides in summary["calls"].items():
        b, h = sides["base"] or (float("nan"),) * 2, sides["head"] or (float("nan"),) * 2
        lines.append(f"| {key} | {b[0]:.0f} | {b[1]:.0f} | {h[0]:.0f} | {h[1]:.0f} |")
    lines += ["", "## Timings, each over its run's control", "",
              "| measure | base (runs) | head (runs) | head - base | spread | slower beyond it |",
              "|---|---|---|---:|---:|---|"]
    for row in summary["timed"]:
        runs = {s: ", ".join(f"{v:.3f}" for v in row[s]) for s in SIDES}
        lines.append(f"| {row['measure']} | {runs['base']} | {runs['head']} | "
                     f"{row['head_median'] - row['base_median']:+.3f} | {row['noise']:.3f} | "
                     f"{'yes' if row['slower_beyond_noise'] else 'no'} |")
    lines += ["", "![before and after](results.png)", ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"meta": meta, **summary}, indent=1),
                                      encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["timed"]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["base_median"] for r in rows], 0.4, label="base")
    ax.bar([x + 0.2 for x in xs], [r["head_median"] for r in rows], 0.4, label="head")
    ax.set_xticks(list(xs), [r["measure"] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("ratio over the run's control")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--rate", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    meta = {"base": args.base, "rounds": args.rounds, "rate": args.rate, "command": args.command}
    render(out, summarise(out, args.rounds), meta)


if __name__ == "__main__":
    main()
