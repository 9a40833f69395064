"""The report of scripts/bench_shard.sh: shard_optimizer's memory per model, mode and world size
(memory.jsonl), and its speed beside dear, torch-zero, hvd and torch DDP (speed/results.json).

    python scripts/shard_report.py benchmarks/shard
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MODES = ("plain", "sharded", "torch-zero")
LABELS = {"plain": "dear", "sharded": "dear, `shard_optimizer`",
          "torch-zero": "DDP + `ZeroRedundancyOptimizer`"}
SLACK = 0.05  # issue 57's target: at most 1/N of the unsharded state plus 5%


def memory_rows(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (model, ranks, mode): the fullest rank's state and RSS, against plain."""
    plain = {(r["model"], r["ranks"]): max(r["state_bytes"]) for r in rows
             if r["mode"] == "plain"}
    lines = ["| model | ranks | mode | state MB, fullest rank | vs plain | target (1/N + 5%) "
             "| peak RSS MB, fullest rank |", "|---|---:|---|---:|---:|---:|---:|"]
    order = {m: i for i, m in enumerate(MODES)}
    for r in sorted(rows, key=lambda r: (r["model"], r["ranks"], order[r["mode"]])):
        whole = plain.get((r["model"], r["ranks"]))
        held = max(r["state_bytes"])
        share = "-" if not whole else f"{held / whole:.3f}"
        target = "" if r["mode"] == "plain" else f"{(1 + SLACK) / r['ranks']:.3f}"
        if r["mode"] != "plain" and whole:
            target += " met" if held <= whole * (1 + SLACK) / r["ranks"] else " **missed**"
        lines.append(f"| {r['model']} | {r['ranks']} | {LABELS[r['mode']]} | {held / 1e6:.1f} "
                     f"| {share} | {target} | {max(r['peak_rss_bytes']) / 1e6:.0f} |")
    return lines


def speed_lines(results: dict[str, Any]) -> list[str]:
    """The speed job's table and the two ratios issue 57 sets targets for."""
    rows = results["rows"]
    by_name = {r["name"]: r for r in rows}
    dear = next((r for r in rows if r["name"].startswith("commsched:dear")
                 and "shard" not in r["name"] and "#control" not in r["name"]), None)
    sharded = next((r for r in rows if "shard_optimizer" in r["name"]), None)
    control = next((r for r in rows if r["name"].endswith("#control")), None)
    zero = by_name.get("torch-zero")
    lines = ["| candidate | median ms | vs hvd | vs torch-ddp "
             "| optimizer state MB (fullest rank) |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        state = r.get("state_bytes")
        lines.append(f"| {r['name']} | {r['median_ms']:.1f} | {_ratio(r.get('vs_hvd'))} "
                     f"| {_ratio(r.get('vs_torch-ddp'))} "
                     f"| {'-' if state is None else f'{state / 1e6:.1f}'} |")
    lines.append("")
    if dear and sharded:
        ratio = sharded["median_ms"] / dear["median_ms"]
        noise = (f"; the control of dear read {control['median_ms'] / dear['median_ms']:.3f}x"
                 if control else "")
        lines.append(f"- sharded dear / dear: **{ratio:.3f}x** (target at most 1.03x{noise}).")
    if sharded and zero:
        ratio = sharded["median_ms"] / zero["median_ms"]
        lines.append(f"- sharded dear / torch-zero: **{ratio:.3f}x** (target below 1).")
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    text = ["# shard_optimizer: memory and speed (issue 57)", "",
            "Adam (two state tensors per parameter), commsched's `dear` with and without "
            "`shard_optimizer`, and torch DDP with `ZeroRedundancyOptimizer` (whole parameters, "
            "broadcast after its step).", ""]
    memory = args.out / "memory.jsonl"
    if memory.exists():
        rows = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
        command = (args.out / "memory_command.txt").read_text().strip()
        text += ["## Memory", "", f"Command: `{command}`.", "",
                 "One job per row, unshaped, a few steps at the real models' reduced inputs "
                 "(benchmarks.harness.shard_memory), no profiling steps (they run unsharded). The "
                 "state is what the rank holds after the run; peak RSS is the process's "
                 "maximum.", "",
                 *memory_rows(rows), ""]
    speed = args.out / "speed" / "results.json"
    if speed.exists():
        results = json.loads(speed.read_text())
        meta = results["meta"]
        text += ["## Speed", "", f"{meta['model']}, {meta['world_size']} ranks, "
                 f"{meta['network']}. Command: "
                 f"`{(args.out / 'speed_command.txt').read_text().strip()}`, which runs "
                 f"`{meta['command']}` in the shaped namespace.", "",
                 *speed_lines(results), ""]
    (args.out / "README.md").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
