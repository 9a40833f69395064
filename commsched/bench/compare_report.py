"""The comparison's report: the markdown table, the bound and floor lines, `auto`'s verdict,
two planners set apart from the noise (planner_pair), and results.json/.md/.png."""

from __future__ import annotations

import json
import os
from typing import Any

from .compression_speed import parse_candidate
from .resample import LEVEL


def markdown_table(rows: list[dict]) -> str:
    predicted = any("predicted_ms" in r for r in rows)
    floor = any("vs_floor" in r for r in rows)
    wire = any("payload_bytes" in r for r in rows)
    memory = any("state_bytes" in r for r in rows)
    extra = (" vs floor |" if floor else "") + (" predicted ms | error |" if predicted else "") \
        + (" payload MB/iter | sent MB/iter |" if wire else "") \
        + (" optimizer state MB (fullest rank) |" if memory else "")
    lines = ["| candidate | median ms | p10 ms | p90 ms | vs hvd | vs torch-ddp | vs bound |"
             + extra,
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if floor else "")
             + ("---:|---:|" if predicted else "") + ("---:|---:|" if wire else "")
             + ("---:|" if memory else "")]
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


def verdicts_of(found: dict | list[dict] | None) -> list[dict]:
    """A report's `auto` verdicts (commsched.bench.validate.auto_verdict): one per `auto`
    candidate; a report written before there could be several holds one, as a dict."""
    return [found] if isinstance(found, dict) else list(found or [])


def auto_line(found: dict | list[dict] | None) -> str:
    """One line per `auto` candidate's verdict."""
    return "".join(_verdict_line(verdict) for verdict in verdicts_of(found))


def _verdict_line(verdict: dict) -> str:
    predicted, ratio = verdict["auto_predicted_ms"], verdict.get("auto_vs_fastest")
    against = "" if ratio is None else (
        f"; auto measured {verdict['auto_median_ms']:.1f} ms, {ratio:.3f}x the fastest other "
        f"commsched candidate ({verdict['measured_fastest_ms']:.1f} ms): within 2%: "
        f"{'yes' if verdict['auto_within_tolerance'] else 'no'}{_resampled_auto(verdict)}")
    who = f"`{verdict['auto']}`" if "?" in verdict.get("auto", "") else "`auto`"
    trials = verdict.get("auto_trials") or {}
    measured = "" if not trials else "; its trial windows (ms): " + ", ".join(
        f"{plan} {'/'.join(f'{ms:.1f}' for ms in windows)}" for plan, windows in trials.items())
    leaders = verdict.get("auto_ranking") or {}
    if leaders:
        measured += "; its ranking, the best of each policy (predicted ms): " + ", ".join(
            f"{plan} {ms:.1f}" for plan, ms in leaders.items())
    return (f"\n{who} picked {verdict['auto_policy']} {verdict['auto_knobs']} (predicted "
            f"{'-' if predicted is None else f'{predicted:.1f} ms'}); measured fastest commsched "
            f"candidate: {verdict['measured_fastest']}; picked the fastest policy: "
            f"{'yes' if verdict['picked_fastest'] else 'no'}{against}{measured}\n")


def _resampled_auto(verdict: dict) -> str:
    """Note [Resampling whole rounds] in resample.py."""
    spread = verdict.get("auto_vs_fastest_interval")
    if spread is None:
        return ""
    return (f" (over resampled rounds: {_spread(spread)}, within 2% in "
            f"{100 * verdict['auto_within_tolerance_share']:.0f}% of draws)")


def _spread(spread: list[float]) -> str:
    return f"{spread[0]:.3f}-{spread[1]:.3f}x in {100 * LEVEL:.0f}% of draws"


def pair_lines(pairs: list[dict[str, Any]] | None) -> str:
    """One line per pair of planners (bench/planner_pair.py): measured, and on the same
    profiles."""
    text = ""
    for pair in pairs or []:
        first, second = parse_candidate(pair["first"])[0], parse_candidate(pair["second"])[0]
        text += f"\n{first} against {second}: {_measured(pair)}"
        same = pair.get("same_profiles")
        if same:
            ratios = same["predicted_ratios"]
            text += (f"; both planned on the same {same['profiles']} overlap profiles and "
                     f"simulated: identical plans on {same['identical_plans']}, {first} "
                     f"predicted {min(ratios):.3f}-{max(ratios):.3f}x {second}")
        text += "\n"
        for control in pair.get("controls") or []:
            text += (f"\n{parse_candidate(control['label'])[0]} against its control (the same "
                     f"candidate run again in this job): {_measured(control)}\n")
    return text


def _measured(entry: dict[str, Any]) -> str:
    spread = entry.get("measured_ratio_interval")
    paired = entry.get("paired_ratio")
    return (f"measured {entry['measured_ratio']:.3f}x (ratio of medians"
            f"{'' if spread is None else '; over resampled rounds ' + _spread(spread)})"
            + ("" if paired is None else
               f", {paired:.3f}x paired by round (median of per-round ratios)"))


def write_outputs(out_dir: str, rows: list[dict], meta: dict, bound: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "bound": bound, "rows": rows}, handle, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as handle:
        network = f", {meta['network']}" if meta.get("network") else ""
        commit = f" (commit {meta['commit']})" if meta.get("commit") else ""
        handle.write(f"# {meta['model']} on {meta['world_size']} ranks{network}\n\n"
                     f"Command: `{meta['command']}`{commit}\n\n{markdown_table(rows)}\n\n"
                     f"{bound_lines(bound)}\n" + auto_line(bound.get("auto"))
                     + pair_lines(bound.get("pairs")))
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
