"""Writes benchmarks/real/README.md from the jobs of scripts/bench_real.sh: per model, every
candidate's median with its ratio to the `hvd` of its own job, and the best policy against the
floor and the targets of issue 55 (best <= 0.85x hvd and <= 1.10x the floor; none > 1.05x hvd).

    python scripts/real_report.py benchmarks/real --command "..."
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from commsched.bench.compare_report import ratio_cell

COMMSCHED = "commsched:"
# Issue 55's targets: the best policy within these of its job's hvd and of the floor; none above
# SLOWEST of its job's hvd.
BEST_VS_HVD, BEST_VS_FLOOR, SLOWEST = 0.85, 1.10, 1.05


def _jobs(root: str, model: str) -> dict[str, dict[str, Any]]:
    jobs = {}
    for group in sorted(os.listdir(os.path.join(root, model))):
        path = os.path.join(root, model, group, "results.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                jobs[group] = json.load(handle)
    return jobs


def _floor(jobs: dict[str, dict[str, Any]]) -> tuple[float | None, bool]:
    """The lowest floor over the jobs whose profiles know each tensor's first user, else over
    every job; and whether it knew them.

    A synchronous job's profiles do not record the forward's modules, so its floor lets every
    gradient arrive as late as the next backward (sim/floor.py): on GPT-2 that hides the
    stretch of its head's compute in which no gradient may move (benchmarks/real/gpt2-4gbit/
    floor_gap.md), a bound too loose to judge a schedule by. Within a job, compare_predict
    makes the same choice."""
    bounds = [job["bound"] for job in jobs.values() if job["bound"].get("floor_ms") is not None]
    informed = [b for b in bounds if b.get("floor_module_info")]
    chosen = informed or bounds
    return min((b["floor_ms"] for b in chosen), default=None), bool(informed)


def _auto_line(group: str, verdict: dict[str, Any]) -> str:
    ratio = verdict.get("auto_vs_fastest")
    return (f"`auto` in `{group}` kept {verdict.get('auto_policy')} "
            f"{verdict.get('auto_knobs') or ''}; measured fastest other commsched candidate: "
            f"{verdict.get('measured_fastest')}; auto "
            f"{'-' if ratio is None else f'{ratio:.3f}x'} it (target: within 3%).")


def _both_targets_line(rows: list[tuple[str, dict[str, Any], float | None]]) -> str:
    """The fastest candidate (by its job's hvd) that meets both of the best policy's targets
    in its own job: the best by ratio may come from a slower job and miss the floor's."""
    both = [(group, row, vs_floor) for group, row, vs_floor in rows
            if row["vs_hvd"] <= BEST_VS_HVD and vs_floor is not None
            and vs_floor <= BEST_VS_FLOOR]
    if not both:
        return "Both targets in one candidate: none."
    group, row, vs_floor = min(both, key=lambda item: item[1]["vs_hvd"])
    return (f"Both targets in one candidate: {row['name']} ({group}), {row['vs_hvd']:.3f}x hvd, "
            f"{vs_floor:.3f}x the floor.")


def model_lines(model: str, jobs: dict[str, dict[str, Any]]) -> list[str]:
    floor, informed = _floor(jobs)
    lines = [f"## {model}", "", "| job | candidate | median ms | vs its job's hvd | vs DDP | "
             "vs floor | hvd waits |", "|---|---|---:|---:|---:|---:|---:|"]
    commsched_rows = []
    for group, job in jobs.items():
        waiting = job["bound"].get("hvd_waiting_fraction")
        for row in job["rows"]:
            ddp = row.get("vs_torch-ddp")
            vs_floor = row["median_ms"] / floor if floor else None
            lines.append(
                f"| {group} | {row['name']} | {row['median_ms']:.1f} | {row['vs_hvd']:.3f} | "
                f"{ratio_cell(ddp)} | {ratio_cell(vs_floor)} | "
                f"{'-' if waiting is None else f'{100 * waiting:.0f}%'} |")
            if row["name"].startswith(COMMSCHED):
                commsched_rows.append((group, row, vs_floor))
    best_group, best, best_floor = min(commsched_rows, key=lambda item: item[1]["vs_hvd"])
    worst_group, worst, _ = max(commsched_rows, key=lambda item: item[1]["vs_hvd"])
    floor_text = "-" if best_floor is None else f"{best_floor:.3f}x"
    source = ("the lowest over the profiles that record each tensor's first user" if informed
              else "the lowest over every job's profiles; none records first users")
    lines += ["", f"Floor: {floor:.1f} ms ({source})." if floor else "Floor: not computed.",
              f"Best commsched policy: {best['name']} ({best_group}), {best['vs_hvd']:.3f}x "
              f"hvd (target <= {BEST_VS_HVD}x), {floor_text} the floor (target <= "
              f"{BEST_VS_FLOOR:.2f}x).", _both_targets_line(commsched_rows),
              f"Slowest commsched policy: {worst['name']} ({worst_group}), "
              f"{worst['vs_hvd']:.3f}x hvd (target <= {SLOWEST}x).", ""]
    for group, job in jobs.items():
        commit = job["meta"].get("commit")
        lines.append(f"Job `{group}`: `{job['meta']['command']}`, {job['meta']['network']}"
                     + (f", commit {commit}." if commit else "."))
        for verdict in job["bound"].get("auto") or []:
            lines.append(_auto_line(group, verdict))
    return lines + [""]


def _remember(root: str, command: str) -> list[str]:
    """Every command that wrote into `root`, this one added (commands.txt keeps them)."""
    path = os.path.join(root, "commands.txt")
    commands = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            commands = [line.rstrip("\n") for line in handle if line.strip()]
    if command not in commands:
        commands.append(command)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{c}\n" for c in commands))
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root")
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    commands = _remember(args.root, args.command)
    lines = ["# Real models: every policy against hvd and DDP", "",
             "Commands, one after another (each job under `horovodrun --gloo`, inside a network "
             "namespace whose loopback is shaped; scripts/netem.sh):", "",
             *[f"* `{command}`" for command in commands], "",
             "Full-size gradients, reduced inputs (docs/examples.md). Median iteration time "
             "of the slowest rank; candidates interleaved round by round within each job. A "
             "ratio is read against the `hvd` of the same job: jobs ran one after another.", ""]
    for model in sorted(os.listdir(args.root)):
        if os.path.isdir(os.path.join(args.root, model)):
            lines += model_lines(model, _jobs(args.root, model))
    with open(os.path.join(args.root, "README.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))


if __name__ == "__main__":
    main()
