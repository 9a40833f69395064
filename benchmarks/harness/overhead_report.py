"""The overhead benchmark's report: its targets (issue 13 items 3 and 4), the markdown table
and the plot. The measuring side is benchmarks/harness/overhead.py."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from .resample import LEVEL, interval, resampled, round_series

POLICIES = ("horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto")
SYNCHRONOUS = ("horovod", "ddp", "mgwfbp")
# Note [The engine kept]
# A world of one steps as the plain optimizer once its plan settled (Note [A world of one steps
# as the plain optimizer] in runtime/modes/plain.py): what a policy's row measures there is
# what a user of one process pays. What the runtime costs where it runs, beside peers, is no
# longer in that row; a candidate named "<policy> (engine kept)" never passes through, so its
# row keeps measuring the hooks, the engine's wait and the overlap runner per step (the
# overlap policies' by default: theirs is the cost item 1 of issue 13 cut, and the one a GPU
# with peers pays).
KEPT = " (engine kept)"
CANDIDATES = POLICIES + tuple(f"{p}{KEPT}" for p in ("bytescheduler", "prophet", "dear"))
PLAIN = "plain"
# A second plain optimizer on its own copy of the model: what it measures against the first is
# the noise floor of the table (the machine, and each model instance's memory layout).
CONTROL = "plain (control)"
GPT2 = "gpt2"
GPT2_LAYOUT = "gpt2_layout"  # GPT-2's tensors at width 32: harness/gpt2_layout.py
# Each best-median figure and the per-round medians it is the smallest of, per clock.
ROUNDS_OF = {"best_median_ms": "round_medians_ms", "free_best_median_ms": "free_round_medians_ms"}


# Note [The range of a best round]
# Each verdict prints the interval its figure covers over resampled rounds (Note [Resampling
# whole rounds] in resample.py), the figure computed in each draw as measured: a ratio of best
# rounds, and for `auto` its best over that of the policy fastest in the draw. A minimum's
# bootstrap never goes below the smallest round measured and repeats it in about two draws in
# three, so on average these intervals are narrower than the spread of the figure over repeated
# runs: one that straddles the target says the run did not settle it, and one clear of the
# target is evidence, not proof. With several builds of the candidates (Note [Builds of the
# candidates] in overhead.py) a draw picks builds before rounds (Note [Resampling builds] in
# resample.py), so the interval holds how far the builds' copies differ as well.
def verdict(ratio: float, limit: float, rows: list[dict[str, Any]], key: str,
            statistic: Callable[[dict[str, float]], float], builds: int = 1) -> str:
    """Met or missed by the figure itself, and where the rows kept the same rounds, the interval
    the figure covers over them resampled (Note [The range of a best round])."""
    said = "met" if ratio <= limit else "MISSED"
    spread = resampled_interval(rows, key, statistic, builds)
    if spread is None:
        return said
    low, high = spread
    settled = high <= limit or low > limit
    return f"{said}; {_covered(spread, builds)}" + ("" if settled else ": the rounds cannot tell")


def _resampled(builds: int) -> str:
    """What a draw picked (Note [Resampling builds] in resample.py)."""
    return "resampled rounds" if builds == 1 else "resampled builds and rounds"


def _covered(spread: tuple[float, float], builds: int) -> str:
    """A ratio's interval over the resampled rounds, as every verdict prints it."""
    return f"{LEVEL:.0%} of {_resampled(builds)} {spread[0]:.3f}-{spread[1]:.3f}x"


def resampled_interval(rows: list[dict[str, Any]], key: str,
                       statistic: Callable[[dict[str, float]], float], builds: int = 1
                       ) -> tuple[float, float] | None:
    """The interval `statistic` of the rows' best rounds covers over their rounds resampled
    (`builds`: how many builds' rounds they are, one after another), or None where the rows did
    not keep the same rounds."""
    series = round_series(rows, [row["candidate"] for row in rows], name_key="candidate",
                          rounds_key=ROUNDS_OF[key])
    if series is None:
        return None
    return interval(resampled(series, statistic, summary=min, builds=builds))


def _ratio_of(name: str, reference: str) -> Callable[[dict[str, float]], float]:
    return lambda best: best[name] / best[reference]


def _policies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["candidate"] in POLICIES and r["candidate"] != "auto"]


def _row_of(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["candidate"] == name), None)


def _over_fastest(name: str, policies: list[dict[str, Any]]
                  ) -> Callable[[dict[str, float]], float]:
    names = [r["candidate"] for r in policies]
    return lambda best: best[name] / min(best[policy] for policy in names)


def auto_against_fastest(model: str, rows: list[dict[str, Any]], key: str, clock: str,
                         builds: int = 1) -> str:
    """Issue 13 item 4 in a world of one: `auto` within 2% of the fastest policy measured."""
    policies, auto = _policies(rows), _row_of(rows, "auto")
    if auto is None or not policies:
        return ""
    fastest = min(policies, key=lambda r: r[key])
    ratio = auto[key] / fastest[key]
    said = verdict(ratio, 1.02, [auto, *policies], key, _over_fastest("auto", policies), builds)
    return (f"{model} auto, {clock}: {ratio:.3f}x the fastest policy ({fastest['candidate']}) "
            f"(target <= 1.02x) {said}")


# Note [What no commsched code reads against the fastest policy]
# Past its warm-up every policy in a world of one, `auto` included, steps as the plain
# optimizer (Note [A world of one steps as the plain optimizer] in runtime/modes/plain.py), so
# the policies differ only by where each copy of the model landed in memory, and "the fastest
# policy" is the luckiest of six such copies: a minimum, biased low. The control, a second
# plain optimizer, runs no commsched code at all; held to the same figure (its best over the
# fastest policy's, resampled the same way) it reads what item 4's world-of-one clause reads
# for a candidate that costs nothing. Its reading beside `auto`'s in one run, on the CNN and
# the Transformer (measured in benchmarks/overhead/cpu/README.md), shows that a reading of
# `auto` near the control's does not tell `auto` from the plain optimizer.
def control_against_fastest(model: str, rows: list[dict[str, Any]], key: str, clock: str,
                            builds: int = 1) -> str:
    """The control held to `auto`'s world-of-one figure (Note [What no commsched code reads
    against the fastest policy])."""
    policies, control = _policies(rows), _row_of(rows, CONTROL)
    if control is None or _row_of(rows, "auto") is None or not policies:
        return ""
    fastest = min(policies, key=lambda r: r[key])
    spread = resampled_interval([control, *policies], key, _over_fastest(CONTROL, policies),
                                builds)
    ratio = control[key] / fastest[key]
    return (f"{model} control against the fastest policy, {clock}: {ratio:.3f}x"
            " (what a candidate running no commsched code reads by auto's figure"
            + ("" if spread is None else f"; {_covered(spread, builds)}") + ")")


def _difference_of(name: str, reference: str) -> Callable[[dict[str, float]], float]:
    return lambda best: best[name] - best[reference]


def host_cost(model: str, rows: list[dict[str, Any]], builds: int = 1) -> list[str]:
    """What each candidate adds to the plain optimizer's step, in milliseconds, with the interval
    it covers over the rounds resampled: GPT-2's layout sets no target of its own, its reading
    is this difference (Note [A host-bound step on a CPU] in gpt2_layout.py)."""
    plain = rows[0]["candidate"]
    out = []
    for row in rows[1:]:
        name = row["candidate"]
        added = row["best_median_ms"] - rows[0]["best_median_ms"]
        spread = resampled_interval([rows[0], row], "best_median_ms",
                                    _difference_of(name, plain), builds)
        out.append(f"{model} {name}: adds {added:.3f} ms per step to the plain optimizer's"
                   + ("" if spread is None else f"; {LEVEL:.0%} of {_resampled(builds)} "
                                                f"{spread[0]:.3f} to {spread[1]:.3f} ms"))
    return out


def targets(model: str, device: str, rows: list[dict[str, Any]], builds: int = 1) -> list[str]:
    """The issue's targets, checked: CPU CNN/Transformer <= 1.03x, MLP <= 1.10x; GPU GPT-2
    synchronous <= 1.03x, overlap <= 1.05x (`builds`: how many builds the rows' rounds come
    from); for GPT-2's layout, what each candidate adds per step."""
    if model == GPT2_LAYOUT:
        return host_cost(model, rows, builds)
    out = []
    for row in rows[1:]:
        if row["candidate"] == CONTROL:
            continue
        if device == "cpu" and model in ("cnn", "transformer", "mlp"):
            limit = 1.10 if model == "mlp" else 1.03
        elif device == "cuda" and model == GPT2:
            limit = 1.03 if row["candidate"].removesuffix(KEPT) in SYNCHRONOUS else 1.05
        else:
            continue
        said = verdict(row["vs_plain"], limit, [rows[0], row], "best_median_ms",
                       _ratio_of(row["candidate"], rows[0]["candidate"]), builds)
        out.append(f"{model} {row['candidate']}: {row['vs_plain']:.3f}x (target <= {limit:.2f}x) "
                   f"{said}")
    # Item 4 where item 3 sets targets: the GPU's built-in models are launch-bound, and there
    # the plain optimizer against its control already moves by 7-24%.
    if not out:
        return []
    # (figure, ratio to plain, the clock's name): on a CPU the one clock is just "per step".
    clocks = [("best_median_ms", "vs_plain",
               "synchronised per step" if device == "cuda" else "per step")]
    if device == "cuda" and "free_best_median_ms" in rows[0]:
        clocks.append(("free_best_median_ms", "free_vs_plain", "free-running"))
    for key, _, clock in clocks:
        out.append(auto_against_fastest(model, rows, key, clock, builds))
        out.append(control_against_fastest(model, rows, key, clock, builds))
    out.append(noise(model, rows, clocks, builds))
    return [line for line in out if line]


# Note [A target within the noise]
# Item 4's world-of-one target holds `auto` within 2% of the fastest policy. On a lent H100,
# GPT-2 124M's steps are largely the host's Python, and its speed moves by more than that: in
# four runs of 10-20 rounds the control's reading of the plain optimizer strayed from 1.000 by
# more than 2% (measured in benchmarks/gpu/README.md), the fastest policy was bytescheduler twice,
# then prophet (or mgwfbp on the free-running clock), then dear, and the smallest of several
# best-of-rounds figures is itself biased low by that noise. So the report prints the control's
# reading beside the targets (noise() below): a figure closer to its limit than the control is to
# 1.000 does not tell commsched from the machine, on whichever side of the limit it falls.
# The control's own interval over resampled rounds shows how far Note [The range of a best
# round] can be trusted on that machine: there the control's reading was clear of 1.000 in more than
# one run (benchmarks/gpu/README.md), so two identical candidates can differ by more than the noise
# between rounds, and a verdict's interval clear of its target by less than the control's offset
# from 1.000 settles nothing either.
def noise(model: str, rows: list[dict[str, Any]], clocks: list[tuple[str, str, str]],
          builds: int = 1) -> str:
    """What the control read against the plain optimizer on each clock, and the interval that
    reading covers over the rounds resampled (Note [A target within the noise])."""
    control = next((r for r in rows if r["candidate"] == CONTROL), None)
    if control is None:
        return ""
    readings = []
    for key, ratio, clock in clocks:
        if ratio not in control:
            continue
        spread = resampled_interval([rows[0], control], key,
                                    _ratio_of(CONTROL, rows[0]["candidate"]), builds)
        readings.append(f"{control[ratio]:.3f}x {clock}"
                        + ("" if spread is None else f" ({_covered(spread, builds)})"))
    return (f"{model} noise: the control, a second plain optimizer (ideally 1.000x), read "
            + ", ".join(readings))


def _builds(meta: dict[str, Any]) -> str:
    """Where the candidates were built more than once (Note [Builds of the candidates] in
    overhead.py), how often."""
    count = meta.get("instances", 1)
    return "" if count == 1 else f"{count} builds of every candidate, each run for "


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Overhead in a world of one ({meta['device']})", "",
             f"Command: `{meta['command']}`", "",
             f"torch {meta['torch']}, {meta['optimizer']}, {_builds(meta)}"
             f"{meta['rounds']} rounds of at least "
             f"{meta['steps']} steps and {meta['round_ms']:g} ms of the plain optimizer (steps "
             f"per round under each model) after {meta['warmup']} warm-up steps, "
             f"`torch.set_num_threads({meta['threads']})`; rounds interleaved, a new order "
             "every round; figure: each candidate's best per-round median; ratio "
             f"over the plain optimizer's. `{CONTROL}` is a second plain optimizer on its own "
             "copy of the model: its distance from 1.000 is the noise of the table. Each verdict "
             f"gives the interval its figure covers in {LEVEL:.0%} of draws of the rounds with "
             "replacement (Note [The range of a best round] in "
             "benchmarks/harness/overhead_report.py)"
             + ("; a draw picks builds, then rounds of each (Note [Resampling builds] in "
                "benchmarks/harness/resample.py)." if meta.get("instances", 1) > 1 else "."), "",
             f"Allocator: {meta['allocator']}; all candidates share one "
             "process, and so one heap (Note [Page faults are the heap's, not the candidate's] "
             "in benchmarks/harness/allocator.py). Page faults per step: the median over rounds.",
             ""]
    for result in results:
        free = bool(result["rows"]) and "free_best_median_ms" in result["rows"][0]
        builds, planned = result.get("builds", 1), meta.get("instances", 1)
        lines += [f"## {result['model']}", "", f"{result['steps']} steps per round."
                  + (f" Only {builds} of {planned} builds of the candidates measured so far."
                     if builds < planned else "")
                  + (" Free-running: the same number of steps after them, on batches already "
                     "on the device, timed by CUDA events without a synchronisation per step "
                     "(Note [Two clocks on a GPU] in benchmarks/harness/overhead.py)."
                     if free else ""), "",
                  "| candidate | best median ms | vs plain |"
                  + (" free-running ms | vs plain |" if free else "")
                  + " plan installed | update groups | page faults per step |",
                  "|---|---:|---:|" + ("---:|---:|" if free else "") + "---|---:|---:|"]
        for r in result["rows"]:
            plan = r["plan"] or "-"
            if r["auto_chose"]:
                plan = f"{plan} (auto chose {r['auto_chose']})"
            groups = "-" if r["update_groups"] in (None, 0) else str(r["update_groups"])
            free_cells = (f" {r['free_best_median_ms']:.2f} | {r['free_vs_plain']:.3f} |"
                          if free else "")
            lines.append(f"| {r['candidate']} | {r['best_median_ms']:.2f} | "
                         f"{r['vs_plain']:.3f} |{free_cells} {plan} | {groups} | "
                         f"{r['page_faults_per_step']:.0f} |")
        lines.append("")
    # One heading per kind of reading: GPT-2's layout has no targets, only what is added.
    for heading, lines_of in (("Targets", lambda r: r["model"] != GPT2_LAYOUT),
                              ("What each candidate adds per step",
                               lambda r: r["model"] == GPT2_LAYOUT)):
        checks = [line for result in results if lines_of(result) for line in result["targets"]]
        if checks:
            lines += [f"## {heading}", ""] + [f"- {line}" for line in checks] + [""]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.5), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = result["rows"]
        places = list(range(len(rows)))
        ratios = [r["vs_plain"] for r in rows]
        # Bars from 1.0 on a narrow axis: the differences are of a few percent, and from 0 they
        # would not show (nor would a bar's length be its ratio on an axis cut short of 0).
        if rows and "free_vs_plain" in rows[0]:
            free = [r["free_vs_plain"] for r in rows]
            ax.barh([p - 0.2 for p in places], [x - 1.0 for x in ratios], left=1.0, height=0.4,
                    label="synchronised per step")
            ax.barh([p + 0.2 for p in places], [x - 1.0 for x in free], left=1.0, height=0.4,
                    label="free-running")
            ratios += free
            ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        else:
            ax.barh(places, [x - 1.0 for x in ratios], left=1.0)
        if ratios:
            ax.set_xlim(min(0.95, min(ratios) - 0.02), max(1.05, max(ratios) + 0.02))
        ax.set_yticks(places, [r["candidate"] for r in rows])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(result["model"])
        ax.set_xlabel("iteration time / plain optimizer")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend sits below the axes


def render(out: str) -> int:
    """Renders a report again from its results.json, with this code's targets."""
    path = os.path.join(out, "results.json")
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
        meta, results = report["meta"], report["results"]
        for result in results:
            result["targets"] = targets(result["model"], meta["device"], result["rows"],
                                        result.get("builds", 1))
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"overhead: --render {out}: {path} is no overhead report ({type(err).__name__}: "
              f"{err})", file=sys.stderr)
        return 2
    write_report(out, results, meta)
    print(markdown(results, meta), flush=True)
    return 0


def write_report(out: str, results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    # Whole or not at all: a time limit's kill during the write must not leave half a file.
    path = os.path.join(out, "results.json")
    with open(path + ".partial", "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "results": results}, handle, indent=1)
    os.replace(path + ".partial", path)
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown(results, meta))
    plot(results, os.path.join(out, "results.png"))
