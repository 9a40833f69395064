"""What each collective costs on the engine's transport: all-reduce, reduce-scatter and
all-gather as torch.distributed runs them, and the engine's own ring reduce-scatter and
all-gather (csrc/ring.h), over a range of buffer sizes, in one job. Sizes and operations are
interleaved round by round; each figure is the median over rounds of the slowest rank's time.
Run one job per world size under torchrun (scripts/bench_collectives.sh runs 2, 3 and 4 ranks
and merges them):

    torchrun --nproc-per-node 2 -m benchmarks.harness.collectives --out benchmarks/collectives/2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import commsched
from commsched import _C
from commsched.bench.compare import typed_command
from commsched.outputs import OutputPathError, prepare_dir
from commsched.plan import Collective
from commsched.torch_compat import all_gather_single, reduce_scatter_single

KiB = 1 << 10
SIZES = tuple(64 * KiB * 4**k for k in range(6))  # 64 KiB .. 64 MiB
OPS = ("allreduce", "reduce_scatter", "all_gather", "ring_reduce_scatter", "ring_all_gather")
TIMEOUT_MS = 600_000


def operations(group: object, world: int, nbytes: int) -> dict[str, Callable[[], None]]:
    """One closure per operation on a float32 buffer of `nbytes` (the whole buffer: an
    all-gather's output, a reduce-scatter's input)."""
    numel = max(world, nbytes // 4 // world * world)
    full, shard = torch.ones(numel), torch.ones(numel // world)
    out_full, out_shard = torch.empty(numel), torch.empty(numel // world)
    rs, ag = int(Collective.REDUCE_SCATTER), int(Collective.ALL_GATHER)
    return {
        "allreduce": lambda: dist.all_reduce(full, group=group),  # type: ignore[arg-type]
        "reduce_scatter": lambda: reduce_scatter_single(out_shard, full, group),
        "all_gather": lambda: all_gather_single(out_full, shard, group),
        "ring_reduce_scatter": lambda: _C.run_collective(group, rs, full, out_shard, True,
                                                         TIMEOUT_MS),
        "ring_all_gather": lambda: _C.run_collective(group, ag, shard, out_full, True,
                                                     TIMEOUT_MS),
    }


def measure(group: object, world: int, rounds: int, repeats: int) -> dict[int, dict[str, float]]:
    """Per size and operation: median over rounds of the slowest rank's mean time (ms)."""
    samples: dict[int, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in SIZES}
    ops = {n: operations(group, world, n) for n in SIZES}
    for _ in range(rounds):
        for n in SIZES:
            for op in OPS:
                fn = ops[n][op]
                fn()  # warm: buffers, connections
                dist.barrier(group=group)  # type: ignore[arg-type]
                start = time.perf_counter()
                for _ in range(repeats):
                    fn()
                elapsed = torch.tensor([(time.perf_counter() - start) / repeats])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # type: ignore[arg-type]
                samples[n][op].append(1e3 * float(elapsed))
    return {n: {op: statistics.median(v) for op, v in per.items()} for n, per in samples.items()}


def rows_of(world: int, table: dict[int, dict[str, float]]) -> list[dict]:
    rows = []
    for n, ms in table.items():
        native = (ms["reduce_scatter"] + ms["all_gather"]) / ms["allreduce"]
        ring = (ms["ring_reduce_scatter"] + ms["ring_all_gather"]) / ms["allreduce"]
        rows.append({"ranks": world, "bytes": n, **{f"{op}_ms": v for op, v in ms.items()},
                     "native_rs_ag_vs_ar": native, "ring_rs_ag_vs_ar": ring})
    return rows


def size_label(nbytes: int) -> str:
    return f"{nbytes // (1 << 20)} MiB" if nbytes >= 1 << 20 else f"{nbytes // KiB} KiB"


def markdown(rows: list[dict]) -> str:
    lines = ["| ranks | size | all-reduce ms | reduce-scatter ms | all-gather ms | RS+AG / AR "
             "| ring RS ms | ring AG ms | ring RS+AG / AR |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {size_label(r['bytes'])} | {r['allreduce_ms']:.2f} "
                     f"| {r['reduce_scatter_ms']:.2f} | {r['all_gather_ms']:.2f} "
                     f"| {r['native_rs_ag_vs_ar']:.2f} | {r['ring_reduce_scatter_ms']:.2f} "
                     f"| {r['ring_all_gather_ms']:.2f} | {r['ring_rs_ag_vs_ar']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for world in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == world]
        xs = [r["bytes"] for r in mine]
        ax.plot(xs, [r["native_rs_ag_vs_ar"] for r in mine], "o--", label=f"torch, {world} ranks")
        ax.plot(xs, [r["ring_rs_ag_vs_ar"] for r in mine], "s-", label=f"ring, {world} ranks")
    ax.axhline(1.1, color="red", linestyle=":", label="1.1x")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer bytes")
    ax.set_ylabel("(RS + AG) / AR")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(out: str, rows: list[dict], meta: dict) -> None:
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "rows": rows}, handle, indent=1)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(f"Command: `{meta['command']}`\n\n{markdown(rows)}\n")
    plot(rows, os.path.join(out, "results.png"))


def merge(dirs: list[str], out: str, command: str, note: str) -> None:
    """Joins per-world-size results into one report."""
    rows = []
    for d in dirs:
        with open(os.path.join(d, "results.json"), encoding="utf-8") as handle:
            rows += json.load(handle)["rows"]
    write(out, rows, {"command": command, "network": note})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="calls timed together per round")
    parser.add_argument("--out", default="", help="directory for results.json/.md/.png")
    parser.add_argument("--merge", nargs="*", default=None, help="merge these result "
                        "directories into --out instead of measuring")
    parser.add_argument("--note", default="", help="what the network was, for the report")
    args = parser.parse_args(argv)
    try:
        if args.out:
            prepare_dir(args.out, "--out")
    except OutputPathError as err:
        print(f"collectives: {err}", file=sys.stderr)
        return 2
    command = typed_command("benchmarks.harness.collectives", argv)
    if args.merge is not None:
        merge(args.merge, args.out, command, args.note)
        return 0
    torch.set_num_threads(1)
    world = commsched.init()
    group = dist.new_group(backend="gloo")
    rows = rows_of(world.size, measure(group, world.size, args.rounds, args.repeats))
    if world.rank == 0:
        print(markdown(rows), flush=True)
        if args.out:
            write(args.out, rows, {"command": command, "network": args.note})
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
