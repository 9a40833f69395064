"""Writes benchmarks/scale/README.md from what scripts/bench_scale.sh left for each model: the
2-rank measurement with its predictions (validation rows) and the simulator's sweep; or, with
--measured-only, benchmarks/scale/device/README.md from scripts/device_scale.sh's output: the
GPU profiles' sweeps (--gpu) and its jobs (4 and 8 ranks: validation rows alone).

    python scripts/scale_report.py benchmarks/scale resnet50 gpt2 --command "..."
    python scripts/scale_report.py benchmarks/scale/device resnet50-4ranks --measured-only \
        --machine "16 cores; torch 2.11.0" --command "..."
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

UNCOMPRESSED = 1.0


def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def validation_lines(measured: dict[str, Any]) -> list[str]:
    """Each commsched candidate's measured median beside its prediction from its own profile."""
    lines = ["| candidate | measured ms | predicted ms | error |", "|---|---:|---:|---:|"]
    for row in measured["rows"]:
        predicted = row.get("predicted_ms")
        cells = (f"{predicted:.1f}", f"{100 * row['prediction_error']:.1f}%") \
            if predicted is not None else ("-", "-")
        lines.append(f"| {row['name']} | {row['median_ms']:.1f} | {cells[0]} | {cells[1]} |")
    return lines


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return min(rows, key=lambda r: r["iteration_s"])


def sweep_lines(simulated: dict[str, Any]) -> list[str]:
    """Per scenario: the scaling factor of horovod, ddp, the fastest policy, and the fastest
    with PowerSGD (the scaling factor is T(1 worker) / T(n workers), 1.0 = perfect)."""
    (model,) = simulated["models"].values()
    scenarios: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for row in model["rows"]:
        scenarios.setdefault((row["workers"], row["bandwidth_gbit_s"]), []).append(row)
    lines = ["| workers | link | horovod | ddp | fastest policy | PowerSGD rank 4, fastest |",
             "|---:|---|---:|---:|---|---|"]
    for (workers, gbit), rows in sorted(scenarios.items()):
        plain = [r for r in rows if r["compression"] == UNCOMPRESSED]
        by_policy = {r["policy"]: r for r in plain}
        best = _best(plain)
        compressed = [r for r in rows if r["compression"] != UNCOMPRESSED]
        powersgd = f"{_best(compressed)['policy']} {_best(compressed)['scaling']:.3f}" \
            if compressed else "-"
        lines.append(f"| {workers} | {gbit:g} Gbit/s | {by_policy['horovod']['scaling']:.3f} | "
                     f"{by_policy['ddp']['scaling']:.3f} | {best['policy']} "
                     f"{best['scaling']:.3f} | {powersgd} |")
    return lines


def _measured_lines(measured: dict[str, Any]) -> list[str]:
    """A job's ranks, link and torchrun command, then its validation rows."""
    meta = measured["meta"]
    return [f"Measured: {meta['world_size']} ranks, {meta['network']}, command "
            f"`torchrun --standalone --nproc_per_node={meta['world_size']} -m "
            f"{meta['command'].removeprefix('python -m ')}`.", "",
            *validation_lines(measured), ""]


def model_section(root: str, name: str) -> list[str]:
    measured = _load(os.path.join(root, name, "measured", "results.json"))
    simulated = _load(os.path.join(root, name, "results.json"))
    return [f"## {name}", "", *_measured_lines(measured),
            "Predicted from the `commsched:dear` candidate's profile "
            f"(`{name}/profiles/candidate3.json`); scaling factor per policy:", "",
            *sweep_lines(simulated), "",
            f"Every policy and knob setting: [{name}/table.md]({name}/table.md). "
            f"![{name}]({name}/scaling.png)", ""]


def measured_section(root: str, job: str) -> list[str]:
    """One job of scripts/device_scale.sh: its command and its validation rows."""
    measured = _load(os.path.join(root, job, "results.json"))
    return [f"## {job}", "", *_measured_lines(measured),
            f"Profiles for `python -m commsched simulate`: `{job}/profiles/`.", ""]


def gpu_section(root: str, model: str) -> list[str]:
    """One model's GPU profile (benchmarks.harness.device_profile): how it was recorded, its
    compute against the plain step, and the sweep predicted from it."""
    folder = os.path.join("gpu", model)
    recording = _load(os.path.join(root, folder, "recording.json"))
    simulated = _load(os.path.join(root, folder, "results.json"))
    plot = os.path.join(folder, "scaling.png")
    return [f"## {model} on the GPU", "",
            f"Recorded: `{recording['command']}` ({recording['device_name']}, torch "
            f"{recording['torch']}, batch {recording['batch_size']}, {recording['inputs']} "
            "inputs, a world of one).", "",
            "| plain step ms (free-running) | the profile's compute ms | error |",
            "|---:|---:|---:|",
            f"| {recording['plain_ms']:.1f} | {recording['profile_compute_ms']:.1f} | "
            f"{100 * recording['error']:.1f}% |", "",
            f"Predicted from `{folder}/profile.json`; scaling factor per policy:", "",
            *sweep_lines(simulated), "",
            f"Every policy and knob setting: [{folder}/table.md]({folder}/table.md)."
            + (f" ![{model}]({plot})" if os.path.exists(os.path.join(root, plot)) else ""), ""]


def device_lines(root: str, jobs: list[str], command: str, machine: str,
                 gpu_models: tuple[str, ...] | list[str] = ()) -> list[str]:
    """benchmarks/scale/device/README.md: the GPU profiles and their sweeps, then what 4 and 8
    ranks measured beside what each candidate's own profile predicted."""
    lines = ["# Scale measured on more ranks: validation of the simulator", "",
             f"Command: `{command}`.", "", f"Machine: {machine}.", ""]
    for model in gpu_models:
        lines += gpu_section(root, model)
    lines += ["Each job below times the candidates side by side on CPU ranks (one thread each), "
              "gradients at full size and inputs reduced (docs/examples.md); each commsched "
              "candidate's own profile then predicts its measured iteration.", ""]
    if not jobs:
        return lines + ["No job finished: see the logs beside this file.", ""]
    for job in jobs:
        lines += measured_section(root, job)
    if os.path.exists(os.path.join(root, "cross_size", "README.md")):
        lines += ["Each rank count predicted from the other's profiles: "
                  "[cross_size/README.md](cross_size/README.md).", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--command", required=True)
    parser.add_argument("--measured-only", action="store_true",
                        help="the arguments after root are device_scale.sh's jobs")
    parser.add_argument("--machine", default="", help="for --measured-only: cores, torch, GPU")
    parser.add_argument("--gpu", nargs="*", default=[], help="for --measured-only: the models "
                        "with a GPU profile under ROOT/gpu/")
    args = parser.parse_args()
    if args.measured_only:
        with open(os.path.join(args.root, "README.md"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(device_lines(args.root, args.models, args.command,
                                                args.machine, args.gpu)))
        return
    lines = ["# Scale by simulation, calibrated on measurement", "",
             f"Command: `{args.command}`.", "",
             "Each model was first measured here: 2 ranks on one 2-core machine's loopback, "
             "its gradients at full size and its inputs reduced (docs/examples.md). Each "
             "commsched candidate's own profile then predicted its measured iteration: the "
             "validation rows. The `dear` candidate's profile, with this CPU's compute times, "
             "then gave the sweep. A GPU computes these models many times faster than a CPU core, "
             "so on a GPU the same links leave far more of the iteration to communication: "
             "these rows show the policies on this CPU's compute, not a GPU cluster's scaling. "
             "GPU profiles of these models have not been recorded yet: scripts/device_scale.sh "
             "records them (benchmarks.harness.device_profile) and sweeps from them where a GPU "
             "is lent, into benchmarks/scale/device/.", "",
             "Whether one number of ranks predicts another: "
             "[cross_size/README.md](cross_size/README.md) predicts each 3-rank job measured "
             "here from its 2-rank job's profiles, and back (scripts/cross_size_report.py).", "",
             "Scaling factor: one worker's iteration time over n workers' (1.0: perfect). "
             "`ddp` is commsched's DDP-bucket policy, the simulator's stand-in for PyTorch DDP.",
             ""]
    for name in args.models:
        lines += model_section(args.root, name)
    with open(os.path.join(args.root, "README.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))


if __name__ == "__main__":
    main()
