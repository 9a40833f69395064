"""The comparison's report: the markdown table, the bound and floor lines, and
results.json/.md/.png. What an analysis of the run adds (the repository's predictions:
benchmarks/harness/prediction_report.py) comes as lines of text."""

from __future__ import annotations

import json
import os

from .cpu_meter import CPU_BOUND


def markdown_table(rows: list[dict]) -> str:
    predicted = any("predicted_ms" in r for r in rows)
    floor = any("vs_floor" in r for r in rows)
    wire = any("payload_bytes" in r for r in rows)
    memory = any("state_bytes" in r for r in rows)
    cpu = any(r.get("cpu_busy") is not None for r in rows)
    extra = (" vs floor |" if floor else "") + (" predicted ms | error |" if predicted else "") \
        + (" payload MB/iter | sent MB/iter |" if wire else "") \
        + (" optimizer state MB (fullest rank) |" if memory else "") \
        + (" cores busy |" if cpu else "")
    lines = ["| candidate | median ms | p10 ms | p90 ms | vs hvd | vs torch-ddp | vs bound |"
             + extra,
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if floor else "")
             + ("---:|---:|" if predicted else "") + ("---:|---:|" if wire else "")
             + ("---:|" if memory else "") + ("---:|" if cpu else "")]
    for r in rows:
        line = (f"| {r['name']} | {r['median_ms']:.1f} | {r['p10_ms']:.1f} | {r['p90_ms']:.1f} "
                f"| {ratio_cell(r['vs_hvd'])} | {ratio_cell(r['vs_torch-ddp'])} "
                f"| {ratio_cell(r.get('vs_bound'))} |")
        if floor:
            line += f" {ratio_cell(r.get('vs_floor'))} |"
        if predicted:
            value, error = r.get("predicted_ms"), r.get("prediction_error")
            line += (f" {'-' if value is None else f'{value:.1f}'} "
                     f"| {'-' if error is None else f'{100 * error:.0f}%'} |")
        if wire:
            line += "".join(f" {_megabytes(r.get(k))} |" for k in ("payload_bytes", "sent_bytes"))
        if memory:
            line += f" {_megabytes(r.get('state_bytes'))} |"
        if cpu:
            busy = r.get("cpu_busy")
            line += (" - |" if busy is None else
                     f" {busy:.0%}{' (CPU-bound)' if busy >= CPU_BOUND else ''} |")
        lines.append(line)
    return "\n".join(lines)


def _megabytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f}"


def ratio_cell(value: float | None) -> str:
    """A ratio as a report's table prints it: three decimals, or '-' where there is none."""
    return f"{value:.3f}" if value is not None else "-"


def bound_lines(bound: dict) -> str:
    def ms(v: float | None) -> str:
        return f"{v:.1f} ms" if v is not None else "-"
    waiting = bound["hvd_waiting_fraction"]
    text = (f"compute (local, no comm): {ms(bound['compute_ms'])}; minimal communication (one "
            f"all-reduce of all gradients): {ms(bound['min_comm_ms'])}; bound max(compute, comm): "
            f"{ms(bound['bound_ms'])}; hvd waits on communication "
            f"{'-' if waiting is None else f'{100 * waiting:.0f}%'} of its iteration")
    if bound.get("floor_ms") is not None:
        binding = bound["floor_binding"]
        shown = ", ".join(binding[:3]) + (f" and {len(binding) - 3} more" if len(binding) > 3
                                          else "")
        text += (f"\nfloor of any cross-iteration schedule (the lowest over the candidates' "
                 f"profiles: {bound['floor_from']}'s): {ms(bound['floor_ms'])}; synchronous "
                 f"semantics add {ms(bound['floor_gap_ms'])} to that profile's naive bound "
                 f"({ms(bound['floor_naive_ms'])}); its tightest window carries {shown}")
    return text


def write_outputs(out_dir: str, rows: list[dict], meta: dict, bound: dict,
                  notes: str = "") -> None:
    """Writes results.json (meta, bound, rows), results.md (the table, the bound lines and
    `notes`, an analysis's lines) and results.png into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "bound": bound, "rows": rows}, handle, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as handle:
        network = f", {meta['network']}" if meta.get("network") else ""
        commit = f" (commit {meta['commit']})" if meta.get("commit") else ""
        handle.write(f"# {meta['model']} on {meta['world_size']} ranks{network}\n\n"
                     f"Command: `{meta['command']}`{commit}\n\n{markdown_table(rows)}\n\n"
                     f"{bound_lines(bound)}\n" + notes)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([r["name"] for r in rows], [r["median_ms"] for r in rows],
            xerr=[[r["median_ms"] - r["p10_ms"] for r in rows],
                  [r["p90_ms"] - r["median_ms"] for r in rows]])
    if bound.get("bound_ms"):
        ax.axvline(bound["bound_ms"], color="red", linestyle="--",
                   label="bound max(compute, min comm)")
    if bound.get("floor_ms"):
        ax.axvline(bound["floor_ms"], color="black", linestyle=":",
                   label="floor of a cross-iteration schedule")
    if bound.get("bound_ms") or bound.get("floor_ms"):
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("median iteration time (ms), whiskers p10-p90")
    ax.set_title(f"{meta['model']}, {meta['world_size']} ranks")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "results.png"), dpi=120)
