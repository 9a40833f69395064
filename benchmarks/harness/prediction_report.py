"""The lines a prediction adds to a comparison's report (compare_predict.py): `auto`'s
verdict per `auto` candidate, and two planners set apart from the noise (planner_pair.py)."""

from __future__ import annotations

from typing import Any

from commsched.bench.candidate import parse_candidate

from .resample import LEVEL


def prediction_lines(bound: dict) -> str:
    """What results.md says below the bound lines of a predicted run."""
    return auto_line(bound.get("auto")) + pair_lines(bound.get("pairs"))


def verdicts_of(found: dict | list[dict] | None) -> list[dict]:
    """A report's `auto` verdicts (measured_vs_predicted.auto_verdict): one per `auto`
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
    """One line per pair of planners (planner_pair.py): measured, and on the same
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
