"""The chaos run's report (benchmarks/harness/chaos.py): results.json, results.md and
results.png in the output folder."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, elapsed_s: float) -> str:
    ok = sum(bool(r["ok"]) for r in results)
    lines = [
        "# Chaos run: a random rank killed at a random point, under elastic Horovod and torchrun",
        "",
        f"Command: `scripts/chaos.sh` (`python -m benchmarks.harness.chaos --trials {args.trials} "
        f"--seed {args.seed} --deadline-s {args.deadline_s:g} --trial-timeout-s "
        f"{args.trial_timeout_s:g} --out {args.out}`). {len(results)} trials in "
        f"{elapsed_s / 60:.1f} min; **{ok} of {len(results)} ended as they must**: resumed "
        "with parameters equal (max |difference| <= 1e-5) to a one-process replay of the "
        "committed history, or, with no restart left, failed with the killed rank named "
        "within COMMSCHED_TIMEOUT + 10 s of the kill.",
        "",
        "Elastic trials: `horovodrun -np 3 --min-np 2 --max-np 3` with a host-discovery script, "
        "`hvd.elastic.run` committing every step. torchrun trials: `--nproc_per_node=2 "
        "--max-restarts=1` (0 where the trial must fail), a checkpoint every 3 of 12 steps "
        "written with `commsched.checkpoint.save` (atomic) and resumed with "
        "`commsched.checkpoint.load`. Elastic trials also run PowerSGD (`+powersgd`), top-k "
        "(`+topk`, plain error feedback under the job's SGD subclass) and a K-FAC "
        "preconditioner in Horovod's state (`+kfac`, float64); their replays run every "
        "rank's compressor from zero in each world and K-FAC on the concatenated batches "
        "(benchmarks/harness/replay.py). Kill points: `top` (the top of the step, before its "
        "forward pass), `forward` (a module's pre-hook), `backward` (a gradient hook), "
        "`in_step` (as the wrapped optimizer's `step()` begins), `step` (inside the "
        "optimizer's update: in `step()` under a synchronous plan, in the next forward pass "
        "under an overlap plan), `save` (elastic: inside `state.commit()`; torchrun: the file "
        "written, not yet renamed). The killed rank dies by SIGKILL or by `os._exit(1)` "
        "(column `how`).",
        "",
        "| # | launcher | policy | killed rank | step | point | how | outcome | errors raised | "
        "max diff | s | ok |",
        "|---:|---|---|---:|---:|---|---|---|---|---:|---:|---|"]
    for r in results:
        kill = r["kill"]
        diff = f"{r['max_diff']:.1e}" if r.get("max_diff") is not None else "-"
        restarts = "" if r["launcher"] != "torchrun" else f" (--max-restarts={r['restarts']})"
        lines.append(f"| {r['index']} | {r['launcher']}{restarts} | {r['policy']} | "
                     f"{kill['rank']} | {kill['step']} | {kill['point']} | "
                     f"{kill.get('how', 'sigkill')} | {r['outcome']} | "
                     f"{', '.join(r['errors']) or '-'} | {diff} | {r['seconds']} | "
                     f"{'yes' if r['ok'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.3 * len(results) + 1.5))
    for row, r in enumerate(results):
        colour = "tab:green" if r["ok"] else "tab:red"
        ax.barh(row, r["seconds"], color=colour)
        ax.text(r["seconds"] + 1, row, f"{r['launcher']} {r['policy']} {r['kill']['point']}: "
                f"{r['outcome']}", va="center", fontsize=7)
    ax.set_yticks(range(len(results)), [str(r["index"]) for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("trial seconds (green: ended as it must)")
    ax.set_title("chaos trials")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(results: list[dict[str, Any]], args: argparse.Namespace,
                 elapsed_s: float) -> None:
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"trials": results, "elapsed_s": elapsed_s, "args": vars(args)}, handle,
                  indent=1)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown(results, args, elapsed_s))
    plot(results, os.path.join(args.out, "results.png"))
