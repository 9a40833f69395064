"""K-FAC iteration time, side by side in one job: pipelined factor traffic with fused blocks and
LPT placement of the decompositions against the unpipelined, round-robin variant (factors and
decompositions refreshed every step), on the built-in CNN.

    horovodrun -np 2 --gloo python -m benchmarks.harness.kfac_speed --out benchmarks/kfac_speed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

import commsched
from commsched.bench.compare import Candidate, run, timing_rows, typed_command
from commsched.bench.models import ModelName, batch, build, loss_fn
from commsched.kfac import KFACPreconditioner

BASELINE = "unpipelined + round_robin"
VARIANTS: dict[str, dict[str, Any]] = {
    "pipelined + lpt": {"pipelined": True, "placement": "lpt"},
    "pipelined + round_robin": {"pipelined": True, "placement": "round_robin"},
    "unpipelined + lpt": {"pipelined": False, "placement": "lpt"},
    BASELINE: {"pipelined": False, "placement": "round_robin"},
}
NO_KFAC = "SGD only (no K-FAC)"


def _candidate(label: str, batch_size: int,
               method: str) -> tuple[Candidate, KFACPreconditioner | None]:
    rank = commsched.rank()
    model = build(ModelName.CNN)
    opt: Any = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(), policy="horovod")
    precond = None
    if label in VARIANTS:
        precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1,
                                     compute_method=method, **VARIANTS[label])

    def step(i: int) -> None:
        x, y = batch(ModelName.CNN, batch_size, i, rank)
        opt.zero_grad()
        loss_fn(ModelName.CNN, model(x), y).backward()
        opt.synchronize()
        if precond is not None:
            precond.step()
        with opt.skip_synchronize():
            opt.step()
    return Candidate(label, step, optimizer=opt), precond


def _rows(candidates: list[Candidate]) -> list[dict[str, Any]]:
    rows = timing_rows(candidates)
    base = next(r["median_ms"] for r in rows if r["name"] == BASELINE)
    for row in rows:
        row["vs_baseline"] = row["median_ms"] / base
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"| variant | median ms | p10 ms | p90 ms | vs {BASELINE} |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['median_ms']:.1f} | {r['p10_ms']:.1f} | {r['p90_ms']:.1f} "
              f"| {r['vs_baseline']:.3f} |" for r in rows]
    return "\n".join(lines)


def _outcome(rows: list[dict[str, Any]]) -> str:
    ratio = {r["name"]: r["vs_baseline"] for r in rows}
    best = ratio["pipelined + lpt"]
    return (f"Outcome: pipelined + fused + lpt is {best:.3f}x the unpipelined + round_robin "
            f"iteration ({100 * (1 - best):.0f}% faster; target at least 10%: "
            f"{'met' if best <= 0.9 else 'not met'}). Pipelining alone: "
            f"{ratio['pipelined + round_robin']:.3f}x; "
            f"lpt alone: {ratio['unpipelined + lpt']:.3f}x.")


def _write(out: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "rows": rows}, handle, indent=1)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(f"Command: `{meta['command']}`\n\n{meta['note']}\n\n{_table(rows)}\n\n"
                     f"{_outcome(rows)}\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh([r["name"] for r in rows], [r["median_ms"] for r in rows],
            xerr=[[r["median_ms"] - r["p10_ms"] for r in rows],
                  [r["p90_ms"] - r["median_ms"] for r in rows]])
    ax.set_xlabel("median iteration time (ms), whiskers p10-p90")
    ax.set_title(f"K-FAC on the built-in CNN, {meta['world_size']} ranks, {meta['network']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "results.png"), dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compute-method", default="eigen", choices=["eigen", "inverse"])
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps per variant (covers "
                        "the factor engine's profiling updates)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--link-note", default="", help="what the network was, for the report")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = commsched.init()
    labels = [*VARIANTS, NO_KFAC]
    made = [_candidate(label, args.batch_size, args.compute_method) for label in labels]
    candidates = [cand for cand, _ in made]
    run(candidates, args.warmup, args.rounds, args.steps)
    rows = _rows(candidates)
    for _, precond in made:
        if precond is not None:
            precond.shutdown()
    if world.rank == 0:
        by_label = dict(zip(labels, (precond for _, precond in made), strict=True))
        lpt, rr = by_label["pipelined + lpt"], by_label[BASELINE]
        assert lpt is not None and rr is not None
        note = (f"{world.size} ranks, batch {args.batch_size} per rank, {args.compute_method}, "
                f"factors and decompositions every step; {rows[0]['samples']} timed steps per "
                f"variant, interleaved over {args.rounds} rounds. Placement lpt: "
                f"{lpt.assignment.describe()}. Placement round_robin: {rr.assignment.describe()}.")
        command = typed_command("benchmarks.harness.kfac_speed", argv)
        meta = {"command": command, "note": note,
                "world_size": world.size, "network": args.link_note, "args": vars(args)}
        print(_table(rows), flush=True)
        if args.out:
            _write(args.out, rows, meta)
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
