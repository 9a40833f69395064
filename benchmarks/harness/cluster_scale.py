"""The real models at 4 to 16 ranks on the cluster testbed (scripts/cluster.sh): each job runs
`compare` on a replayed compute profile (benchmarks/cluster/profiles), every commsched policy,
`auto` and PowerSGD beside torch DDP, in one job per (model, hosts x ranks, link).

    python -m benchmarks.harness.cluster_scale --out benchmarks/cluster

Emulation, as every report states it:
* compute: the profile's (FLOPs at a stated GPU rate), d times slower (Note [Time dilation]);
* bytes: every gradient k times smaller, and with it every byte threshold of every candidate
  (commsched's fusion, bucket, partition and credit sizes, DDP's bucket), so each schedule cuts
  the model where it would at full size;
* links: the real rate divided by k x d, shaped per host (Note [The testbed's network]); ranks
  of one host talk over its loopback, unshaped; per-message latency is the testbed's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from commsched.bench.candidate import LOCAL
from commsched.config import DEAR_BUFFER_BYTES, HOROVOD_FUSION_BYTES, MiB

PROFILES = "benchmarks/cluster/profiles"
POLICIES = ("horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto")


@dataclass(frozen=True)
class ScaleJob:
    model: str
    hosts: int
    ranks_per_host: int
    link_gbit: float  # the real link's rate, per host

    @property
    def label(self) -> str:
        return f"{self.model}/{self.hosts}x{self.ranks_per_host}-{self.link_gbit:g}gbit"


def scaled_knobs(k: int) -> str:
    """The byte thresholds of a commsched candidate at byte scale k (their defaults / k)."""
    return "&".join(f"{name}={max(1, size // k)}" for name, size in (
        ("bucket_bytes", 25 * MiB), ("first_bucket_bytes", 1 * MiB),
        ("partition_bytes", 4 * MiB), ("credit_bytes", 16 * MiB)))


def candidates(k: int) -> list[str]:
    """torch DDP, every policy and `auto`, and PowerSGD (rank 4) on the horovod policy."""
    common = scaled_knobs(k)
    out = [LOCAL, "torch-ddp"]
    for policy in POLICIES:
        fusion = DEAR_BUFFER_BYTES if policy == "dear" else HOROVOD_FUSION_BYTES
        knobs = common if policy == "auto" else f"{common}&fusion_threshold={fusion // k}"
        out.append(f"commsched:{policy}?{knobs}")
    out.append(f"commsched:horovod?{common}&fusion_threshold={HOROVOD_FUSION_BYTES // k}"
               "&compression=powersgd&powersgd_rank=4")
    return out


def tc_rate(job: ScaleJob, k: int, dilation: int) -> str:
    return f"{max(int(job.link_gbit * 1e6 / (k * dilation)), 1)}kbit"


def run_job(job: ScaleJob, args: argparse.Namespace) -> dict:
    out = os.path.join(args.out, job.label)
    os.makedirs(out, exist_ok=True)
    model = (f"profile:{PROFILES}/{job.model}.json?k={args.k}&units={args.units}"
             f"&dilate={args.dilate}")
    command = [sys.executable, "-m", "benchmarks.harness.testbed", "run", "--hosts",
               str(job.hosts), "--ranks-per-host", str(job.ranks_per_host), "--rate",
               tc_rate(job, args.k, args.dilate), "--out", out, "--", "-m",
               "commsched.bench.compare", "--model", model, "--candidates",
               ",".join(candidates(args.k)), "--warmup", "8", "--rounds", str(args.rounds),
               "--steps", str(args.steps), "--batch-size", "2", "--out", out, "--link-note",
               f"{job.link_gbit:g} Gbit/s per host (tc {tc_rate(job, args.k, args.dilate)}), "
               f"k={args.k}, d={args.dilate}"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    with open(os.path.join(out, "log.txt"), "w", encoding="utf-8") as handle:
        handle.write(done.stdout[-20000:] + done.stderr[-20000:])
    print(f"{job.label}: exit {done.returncode} in {time.monotonic() - started:.0f} s",
          flush=True)
    if done.returncode:
        return {"job": job.label, "error": done.stderr[-2000:]}
    with open(os.path.join(out, "results.json"), encoding="utf-8") as handle:
        results = json.load(handle)
    with open(os.path.join(out, "testbed.json"), encoding="utf-8") as handle:
        testbed = json.load(handle)
    return {"job": job.label, "command": shlex.join(command), "results": results,
            "testbed": testbed}


def read_job(job: ScaleJob, args: argparse.Namespace) -> dict:
    """A job's entry from what it wrote ({} where it wrote nothing)."""
    out = os.path.join(args.out, job.label)
    try:
        with open(os.path.join(out, "results.json"), encoding="utf-8") as handle:
            results = json.load(handle)
        with open(os.path.join(out, "testbed.json"), encoding="utf-8") as handle:
            testbed = json.load(handle)
    except OSError:
        return {}
    command = [sys.executable, "-m", "benchmarks.harness.testbed", "run",
               *_testbed_args(testbed), "--", *testbed["job"]]
    return {"job": job.label, "command": shlex.join(command), "results": results,
            "testbed": testbed}


def _testbed_args(testbed: dict) -> list[str]:
    plan = testbed["plan"]
    return ["--hosts", str(plan["hosts"]), "--ranks-per-host", str(plan["ranks_per_host"]),
            "--rate", plan["link"]["rate"]]


def summary_row(entry: dict) -> dict:
    """One job's line: DDP, the fastest policy, `auto`, the floor, the scaling factor."""
    rows = {r["name"]: r for r in entry["results"]["rows"]}
    ddp = rows["torch-ddp"]["median_ms"]
    compute = rows[LOCAL]["median_ms"]
    ours = {n.removeprefix("commsched:").split("?")[0] + ("+powersgd" if "powersgd" in n else ""):
            r["median_ms"] for n, r in rows.items() if n.startswith("commsched:")}
    exact = {n: ms for n, ms in ours.items() if "powersgd" not in n}
    best = min(exact, key=exact.__getitem__)
    bound = entry["results"]["bound"].get("bound_ms")
    return {"job": entry["job"], "ddp_ms": ddp, "compute_ms": compute,
            "ddp_waits": (ddp - compute) / ddp, "best": best, "best_vs_ddp": exact[best] / ddp,
            "best_vs_floor": exact[best] / bound if bound else None,
            "auto_vs_best": exact["auto"] / exact[best], "worst": max(exact, key=exact.__getitem__),
            "worst_vs_ddp": max(exact.values()) / ddp,
            "powersgd_vs_ddp": ours.get("horovod+powersgd", float("nan")) / ddp,
            "scaling_ddp": compute / ddp, "scaling_best": compute / exact[best],
            "cpu_busy_timed": entry["results"]["meta"].get("cpu_busy_timed"),
            "by_policy": {n: ms / ddp for n, ms in ours.items()}}


def write_report(entries: list[dict], args: argparse.Namespace) -> None:
    rows = [summary_row(e) for e in entries if "results" in e]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump({"k": args.k, "dilation": args.dilate, "units": args.units, "rows": rows,
                   "failed": [e for e in entries if "results" not in e],
                   "commands": [e.get("command") for e in entries]}, handle, indent=1)
    lines = ["| job | DDP ms | DDP waits | best | best / DDP | best / floor | auto / best | "
             "slowest / DDP | PowerSGD / DDP | scaling DDP | scaling best | cores busy |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        floor = f"{r['best_vs_floor']:.3f}" if r["best_vs_floor"] else "-"
        busy = r["cpu_busy_timed"] or 0.0
        lines.append(f"| {r['job']} | {r['ddp_ms']:.0f} | {r['ddp_waits']:.0%} | {r['best']} | "
                     f"{r['best_vs_ddp']:.3f} | {floor} | {r['auto_vs_best']:.3f} | "
                     f"{r['worst']} {r['worst_vs_ddp']:.3f} | {r['powersgd_vs_ddp']:.3f} | "
                     f"{r['scaling_ddp']:.2f} | {r['scaling_best']:.2f} | "
                     f"{busy:.0%}{' (CPU-bound)' if busy >= 0.9 else ''} |")
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    names = [r["job"] for r in rows]
    ax.barh(names, [r["best_vs_ddp"] for r in rows], label="fastest policy")
    ax.scatter([r["by_policy"]["auto"] for r in rows], names, color="black", zorder=3,
               label="auto")
    ax.axvline(1.0, color="red", linestyle="--", label="torch DDP")
    ax.set_xlabel("iteration time / torch DDP's (lower is faster)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "summary.png"), dpi=120)


def parse_jobs(text: str) -> list[ScaleJob]:
    """model:HxG:GBIT,... e.g. resnet50:4x4:100."""
    jobs = []
    for item in text.split(","):
        model, topology, gbit = item.split(":")
        hosts, ranks = topology.split("x")
        jobs.append(ScaleJob(model, int(hosts), int(ranks), float(gbit)))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", required=True, help="model:HOSTSxRANKS:GBIT,...")
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--dilate", type=int, default=8)
    parser.add_argument("--units", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="benchmarks/cluster")
    parser.add_argument("--report-only", action="store_true",
                        help="write the summary from the jobs' folders, running nothing")
    args = parser.parse_args()
    run = read_job if args.report_only else run_job
    entries = [run(job, args) for job in parse_jobs(args.jobs)]
    write_report([e for e in entries if e], args)


if __name__ == "__main__":
    main()
