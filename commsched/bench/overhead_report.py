"""The overhead benchmark's report: its targets (issue 13 items 3 and 4), the markdown table
and the plot. The measuring side is commsched/bench/overhead.py."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

POLICIES = ("horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto")
SYNCHRONOUS = ("horovod", "ddp", "mgwfbp")
PLAIN = "plain"
# A second plain optimizer on its own copy of the model: what it measures against the first is
# the noise floor of the table (the machine, and each model instance's memory layout).
CONTROL = "plain (control)"
GPT2 = "gpt2"
# Each best-median figure and the per-round medians it is the smallest of, per clock.
ROUNDS_OF = {"best_median_ms": "round_medians_ms", "free_best_median_ms": "free_round_medians_ms"}


# Note [How far the rounds can tell]
# A figure is a ratio of best per-round medians, and on a noisy machine another run of as many
# rounds reads another ratio. How far it could move is estimated from the run itself: rounds
# are drawn again with replacement (the same draw for every candidate, since a round is a
# stretch of the machine's time that all candidates share), the ratio is computed again, and
# the middle 95% of 2000 draws is printed beside the verdict. A target inside that range is
# one the run cannot tell as met or missed. The estimate errs on the narrow side: a minimum's
# bootstrap never goes below the smallest round measured and repeats it in about 63% of draws,
# so a run whose range straddles a target certainly did not settle it, while a range clear of
# the target is evidence, not proof. `auto` is drawn against the policy measured fastest, fixed:
# choosing the fastest of several noisy figures again in each draw would carry that choice's
# bias (the smallest of six figures equal in truth still reads below each of them) into the
# range as if it were a measurement. The draws are seeded: the same results.json renders the
# same report.
def resampled_range(statistic: Callable[[Sequence[int]], float], rounds: int,
                    draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The middle 95% of `statistic` over `draws` resamplings of `rounds` round indices."""
    rng = random.Random(seed)
    values = sorted(statistic([rng.randrange(rounds) for _ in range(rounds)])
                    for _ in range(draws))
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def _best_ratio(rounds: list[float], reference: list[list[float]]) -> Callable[[Sequence[int]],
                                                                               float]:
    """The statistic of a figure: a candidate's best round over the best round of the fastest
    of `reference`, on the drawn rounds."""
    def statistic(drawn: Sequence[int]) -> float:
        return min(rounds[i] for i in drawn) / min(min(ref[i] for i in drawn)
                                                   for ref in reference)
    return statistic


def verdict(ratio: float, limit: float, row: dict[str, Any], reference: list[dict[str, Any]],
            key: str) -> str:
    """"met" or "MISSED" by the figure itself, and where the rows keep their rounds, the range
    resampling them gives (Note [How far the rounds can tell])."""
    said = "met" if ratio <= limit else "MISSED"
    rounds_key = ROUNDS_OF[key]
    if rounds_key not in row or any(rounds_key not in ref for ref in reference):
        return said
    rounds = row[rounds_key]
    low, high = resampled_range(_best_ratio(rounds, [ref[rounds_key] for ref in reference]),
                                len(rounds))
    settled = high <= limit or low > limit
    return (f"{said}; resampled rounds {low:.3f}-{high:.3f}x"
            + ("" if settled else ": the rounds cannot tell"))


def auto_against_fastest(model: str, rows: list[dict[str, Any]], key: str, clock: str) -> str:
    """Issue 13 item 4 in a world of one: `auto` within 2% of the fastest policy measured."""
    policies = [r for r in rows if r["candidate"] in POLICIES and r["candidate"] != "auto"]
    auto = next((r for r in rows if r["candidate"] == "auto"), None)
    if auto is None or not policies:
        return ""
    fastest = min(policies, key=lambda r: r[key])
    ratio = auto[key] / fastest[key]
    return (f"{model} auto, {clock}: {ratio:.3f}x the fastest policy ({fastest['candidate']}) "
            f"(target <= 1.02x) {verdict(ratio, 1.02, auto, [fastest], key)}")


def targets(model: str, device: str, rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, checked: CPU CNN/Transformer <= 1.03x, MLP <= 1.10x; GPU GPT-2
    synchronous <= 1.03x, overlap <= 1.05x."""
    out = []
    for row in rows[1:]:
        if row["candidate"] == CONTROL:
            continue
        if device == "cpu" and model in ("cnn", "transformer", "mlp"):
            limit = 1.10 if model == "mlp" else 1.03
        elif device == "cuda" and model == GPT2:
            limit = 1.03 if row["candidate"] in SYNCHRONOUS else 1.05
        else:
            continue
        said = verdict(row["vs_plain"], limit, row, rows[:1], "best_median_ms")
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
        out.append(auto_against_fastest(model, rows, key, clock))
    out.append(noise(model, rows, [(ratio, clock) for _, ratio, clock in clocks]))
    return [line for line in out if line]


# Note [A target within the noise]
# Item 4's world-of-one target holds `auto` within 2% of the fastest policy. On a lent H100,
# GPT-2 124M's steps (38-70 ms) are largely the host's Python, and its speed moves by more
# than that: in four runs of 10-20 rounds (benchmarks/gpu/README.md) the control read
# 0.953-1.030x the plain optimizer, the fastest policy was bytescheduler twice, then prophet (or
# mgwfbp on the free-running clock), then dear, and the smallest of several best-of-rounds
# figures is itself biased low by that noise. So the report prints the control's reading
# beside the targets (noise() below): a figure closer to its limit than the control is
# to 1.000 does not tell commsched from the machine, on whichever side of the limit it falls.
def noise(model: str, rows: list[dict[str, Any]], clocks: list[tuple[str, str]]) -> str:
    """What the control read against the plain optimizer on each clock (Note [A target within
    the noise])."""
    control = next((r for r in rows if r["candidate"] == CONTROL), None)
    if control is None:
        return ""
    readings = ", ".join(f"{control[ratio]:.3f}x {clock}" for ratio, clock in clocks
                         if ratio in control)
    return f"{model} noise: the control read {readings} (its own plain optimizer: ideally 1.000x)"


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Overhead in a world of one ({meta['device']})", "",
             f"Command: `{meta['command']}`", "",
             f"torch {meta['torch']}, {meta['optimizer']}, {meta['rounds']} rounds of at least "
             f"{meta['steps']} steps and {meta['round_ms']:g} ms of the plain optimizer (steps "
             f"per round under each model) after {meta['warmup']} warm-up steps, "
             f"`torch.set_num_threads({meta['threads']})`; rounds interleaved, a new order "
             "every round; figure: each candidate's best per-round median; ratio "
             f"over the plain optimizer's. `{CONTROL}` is a second plain optimizer on its own "
             "copy of the model: its distance from 1.000 is the noise of the table.", "",
             f"Allocator: {meta['allocator']}; all candidates share one "
             "process, and so one heap (Note [Page faults are the heap's, not the candidate's] "
             "in commsched/bench/allocator.py). Page faults per step: the median over rounds.",
             ""]
    for result in results:
        free = bool(result["rows"]) and "free_best_median_ms" in result["rows"][0]
        lines += [f"## {result['model']}", "", f"{result['steps']} steps per round."
                  + (" Free-running: the same number of steps after them, on batches already "
                     "on the device, timed by CUDA events without a synchronisation per step "
                     "(Note [Two clocks on a GPU] in commsched/bench/overhead.py)."
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
    checks = [line for result in results for line in result["targets"]]
    if checks:
        lines += ["## Targets", ""] + [f"- {line}" for line in checks] + [""]
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
