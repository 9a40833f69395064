"""What torch.compile costs under each policy: graph breaks counted, iteration time measured.

Run under ``torchrun --nproc_per_node=2`` (scripts/bench_compile.sh runs it on a shaped
loopback). For each policy, one run trains the built-in Transformer eagerly and one trains
``torch.compile(model)`` (default backend) the same way; the second ends with
``torch._dynamo.explain`` of one steady-state forward pass: how many graphs it runs and how many
graph breaks split it, beside the modules whose forward pre-hooks apply update groups (Note
[Module hooks under torch.compile] in commsched/runtime/modes/overlap/runner.py). Rank 0 writes
``results.json`` and ``README.md`` to the output folder.

    torchrun --nproc_per_node=2 scripts/compile_cost.py --out benchmarks/compile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, cast

import torch
import torch._dynamo
from torch import nn

import commsched
from commsched.bench.models import ModelName, batch, build, loss_fn
from commsched.runtime.modes.overlap.runner import HookMode

POLICIES = ["horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"]


def _train(policy: str, compiled: bool, steps: int, timed: int,
           batch_size: int) -> dict[str, Any]:
    rank = commsched.rank()
    eager = build(ModelName.TRANSFORMER)
    model = cast(nn.Module, torch.compile(eager)) if compiled else eager
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(), model=model, policy=policy)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        opt.zero_grad()
        x, y = batch(ModelName.TRANSFORMER, batch_size, step, rank)
        loss_fn(ModelName.TRANSFORMER, model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - started)
    opt.flush()
    runner = opt.session.modes.runner
    active = runner is not None and runner.active
    out: dict[str, Any] = {
        "median_ms": 1000 * statistics.median(times[-timed:]),
        "plan": opt.plan.policy,
        "update_groups": len(runner._groups) if active and runner is not None else 0,
        "hooked": runner.hooked_modules if runner is not None else [],
        "params": [p.detach().clone() for p in eager.parameters()]}
    if compiled:
        probe = batch(ModelName.TRANSFORMER, batch_size, steps, rank)[0]
        for sampled in (False, True):
            if active and runner is not None:
                runner._set_mode(HookMode.ACTIVE, sampled=sampled)
            explained = torch._dynamo.explain(model)(probe)
            kind = "sampled" if sampled else "plain"
            out[f"graph_breaks_{kind}"] = explained.graph_break_count
            out[f"graphs_{kind}"] = explained.graph_count
    opt.session.close()
    return out


def _row(policy: str, eager: dict[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
    diff = max(float((a - b).abs().max())
               for a, b in zip(eager["params"], compiled["params"], strict=True))
    return {"policy": policy, "plan": compiled["plan"],
            "graph_breaks": compiled["graph_breaks_plain"], "graphs": compiled["graphs_plain"],
            "graph_breaks_sampled": compiled["graph_breaks_sampled"],
            "graphs_sampled": compiled["graphs_sampled"],
            "update_groups": compiled["update_groups"],
            "hooked_modules": len(compiled["hooked"]), "eager_ms": eager["median_ms"],
            "compiled_ms": compiled["median_ms"],
            "compiled_vs_eager": compiled["median_ms"] / eager["median_ms"],
            "max_param_diff": diff}


def _markdown(rows: list[dict[str, Any]], command: str, note: str) -> str:
    lines = ["# torch.compile under each policy (built-in Transformer, 2 ranks)", "",
             f"Command: `{command}`", "", note, "",
             "| policy | plan run | graph breaks | graphs | graph breaks, sampled pass "
             "| update groups | hooked modules | eager ms | compiled ms | compiled / eager "
             "| max param diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['plan']} | {r['graph_breaks']} | {r['graphs']} | "
                     f"{r['graph_breaks_sampled']} | "
                     f"{r['update_groups']} | {r['hooked_modules']} | {r['eager_ms']:.1f} | "
                     f"{r['compiled_ms']:.1f} | {r['compiled_vs_eager']:.3f} | "
                     f"{r['max_param_diff']:.2g} |")
    lines += ["", "Graph breaks and graphs: `torch._dynamo.explain` of one forward pass after "
              "training, with the plan in place then. A sampled pass is one in which the "
              "profiler also times every module (every 4th iteration while a plan is checked, "
              "then every 64th): its hooks break the graph at modules too. Hooked modules: "
              "those inside the compiled root whose forward pre-hooks apply update groups, at a "
              "group's start or at the first user of one of its parameters (the root's own "
              "hooks run outside the compiled frame). Times: median of the last timed steps of "
              "one run each, eager and compiled side by side per policy, no control run; not "
              "a benchmark of compilation itself."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--timed", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = commsched.init()
    rows = []
    for policy in args.policies.split(","):
        torch._dynamo.reset()
        eager = _train(policy, False, args.steps, args.timed, args.batch_size)
        compiled = _train(policy, True, args.steps, args.timed, args.batch_size)
        rows.append(_row(policy, eager, compiled))
        if world.rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if world.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        command = os.environ.get("BENCH_COMMAND", " ".join(sys.argv))
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
            json.dump({"command": command, "note": args.note, "rows": rows}, handle, indent=1)
        with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8") as handle:
            handle.write(_markdown(rows, command, args.note))
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
