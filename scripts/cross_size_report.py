"""Predicts each measured job on 3 ranks from the profiles of its 2-rank job, and back, on the
same shaped loopback (benchmarks.harness.cross_size): the check that the scale sweep's other
sizes rest on. It reads committed reports only; nothing is run.

    .venv/bin/python scripts/cross_size_report.py            # writes benchmarks/scale/cross_size/
    .venv/bin/python scripts/cross_size_report.py --check    # exit 1 if results.json differs
    .venv/bin/python scripts/cross_size_report.py --pair resnet50 DIR/resnet50-4ranks \
        DIR/resnet50-8ranks profiles --out DIR/cross_size --command "..."   # other jobs

Pairs (each a `compare` job of both sizes, with where its profiles are):
* ResNet-50 at 2 Gbit/s (benchmarks/real/resnet50{,-3ranks}/all, scripts/bench_real.sh): one
  profile per job is kept (floor_profile.json, `floor`), so every candidate is predicted from it;
* the built-in CNN at 1 Gbit/s (benchmarks/sim_validation/cnn-1gbit{,-3ranks},
  scripts/bench_sim.sh): each candidate from its own end-of-run profile, the
  candidate<N>-end.json that compare's --predict-dir wrote (here into `predict`); and the same
  under shard_optimizer (benchmarks/sim_validation/sharded-cnn-1gbit{,-3ranks}).
scripts/device_scale.sh passes its own jobs with --pair (their profiles in `profiles`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Any

from benchmarks.harness.cross_size import cross_size
from commsched.sim import profile_from_document
from commsched.sim.floor import profile_compute_s

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = "benchmarks/scale/cross_size"
COMMAND = ".venv/bin/python scripts/cross_size_report.py"
# (label, the job of fewer ranks, the job of more, where the profiles are: `floor` for each
# job's floor_profile.json, else the folder of its candidate<N>-end.json files)
PAIRS = (("ResNet-50, 2 Gbit/s", "benchmarks/real/resnet50/all",
          "benchmarks/real/resnet50-3ranks/all", "floor"),
         ("CNN, 1 Gbit/s", "benchmarks/sim_validation/cnn-1gbit",
          "benchmarks/sim_validation/cnn-1gbit-3ranks", "predict"),
         ("CNN under shard_optimizer, 1 Gbit/s", "benchmarks/sim_validation/sharded-cnn-1gbit",
          "benchmarks/sim_validation/sharded-cnn-1gbit-3ranks", "predict"))
WITHIN = 0.15  # the bar benchmarks/sim_validation holds same-size predictions to


def _load(path: pathlib.Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _profiles(job: pathlib.Path, results: dict[str, Any], source: str) -> dict[str, dict]:
    """Per commsched candidate of `job`, the profile document to predict it from."""
    names = [row["name"] for row in results["rows"] if row["name"].startswith("commsched:")]
    if source == "floor":
        document = _load(job / "floor_profile.json")
        return {name: document for name in names}
    ends = [_load(path) for path in sorted((job / source).glob("candidate*-end.json"))]
    by_name = {end["candidate"]: end["profile"] for end in ends}
    return {name: by_name[name] for name in names if name in by_name}


def _compute_ms(profiles: dict[str, dict]) -> float:
    """The median compute of an iteration over the profiles (sim.floor.profile_compute_s)."""
    return 1e3 * statistics.median(profile_compute_s(profile_from_document(document))
                                   for document in profiles.values())


def compute(root: pathlib.Path = ROOT, pairs_in: tuple[tuple[str, str, str, str], ...] = PAIRS,
            command: str = COMMAND) -> dict[str, Any]:
    """Every pair, both ways: the rows and where they came from."""
    pairs = []
    for label, small, large, source in pairs_in:
        jobs = {folder: _load(root / folder / "results.json") for folder in (small, large)}
        profiles = {folder: _profiles(root / folder, jobs[folder], source)
                    for folder in (small, large)}
        for first, second in ((small, large), (large, small)):
            rows = cross_size(jobs[first], jobs[second], profiles[first], profiles[second])
            pairs.append({"model": label, "profiled": first, "predicted": second,
                          "link": jobs[second]["meta"]["network"],
                          "ranks_from": jobs[first]["meta"]["world_size"],
                          "ranks_to": jobs[second]["meta"]["world_size"],
                          "profiles": "floor_profile.json" if source == "floor"
                          else f"each candidate's {source}/candidate<N>-end.json",
                          "compute_from_ms": _compute_ms(profiles[first]),
                          "compute_to_ms": _compute_ms(profiles[second]),
                          "rows": [row.as_json() for row in rows]})
    return {"command": command, "pairs": pairs}


def _row_line(row: dict[str, Any]) -> str:
    measured_from = row["measured_from_ms"]
    own = "-" if measured_from is None else f"{measured_from:.1f}"
    candidate = row["candidate"].removeprefix("commsched:")
    if candidate.startswith("auto"):
        candidate += f" (kept {row['policy']} {row['knobs']})"
    return (f"| {candidate} | {own} | {row['predicted_from_ms']:.1f} | "
            f"{row['measured_to_ms']:.1f} | {row['predicted_to_ms']:.1f} | "
            f"{100 * row['error']:+.1f}% | {100 * row['mixed_error']:+.1f}% | "
            f"{100 * row['own_error']:+.1f}% |")


def render(report: dict[str, Any]) -> str:
    """README.md of the report."""
    errors = [abs(row["error"]) for pair in report["pairs"] for row in pair["rows"]]
    within = sum(error <= WITHIN for error in errors)
    if not errors:
        return "# One size predicts another\n\nNo pair had a commsched candidate in both jobs."
    sizes = sorted({pair[key] for pair in report["pairs"] for key in ("ranks_from", "ranks_to")})
    lines = [f"# One size predicts another: {' and '.join(map(str, sizes))} ranks on one "
             "loopback", "",
             f"Command: `{report['command']}` (reads the jobs named below; nothing is run). "
             "Each job's commsched candidates are predicted from the profiles of the "
             "same model's job on the other number of ranks, at the same link: planned as the "
             "run plans from its profile, on that profile's fitted collectives rescaled for the "
             "ranks that share the loopback (Note [Ranks on one shaped loopback] in "
             "`benchmarks/harness/cross_size.py`). The compute stays the profile's. `auto` is "
             "predicted as the plan it kept in the predicted job.", "",
             "The last two columns separate the communication from the compute: the error "
             "with the other size's collectives (rescaled) but the predicted size's own "
             "compute, from a profile of the predicted job; and the error from that profile "
             "alone, the simulator's own error at that size. Every plan is planned from the "
             "profile it is simulated on.", "",
             f"{within} of {len(errors)} predictions within {WITHIN:.0%} of the measurement; "
             f"the largest error {100 * max(errors):.1f}%.", ""]
    for pair in report["pairs"]:
        lines += [f"## {pair['model']}: {pair['ranks_from']} ranks predict {pair['ranks_to']}",
                  "", f"Link: {pair['link']}. Profiles: `{pair['profiled']}` "
                  f"({pair['profiles']}); measured: "
                  f"`{pair['predicted']}`. The profiles' compute per iteration (median): "
                  f"{pair['compute_from_ms']:.1f} ms on {pair['ranks_from']} ranks, "
                  f"{pair['compute_to_ms']:.1f} ms on {pair['ranks_to']}.", "",
                  f"| candidate | measured on {pair['ranks_from']}, ms | predicted on "
                  f"{pair['ranks_from']}, ms | measured on {pair['ranks_to']}, ms | predicted on "
                  f"{pair['ranks_to']}, ms | error | error with the compute of "
                  f"{pair['ranks_to']} | error from a profile of {pair['ranks_to']} |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [_row_line(row) for row in pair["rows"]] + [""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 6))
    for pair in report["pairs"]:
        rows = pair["rows"]
        axis.scatter([row["measured_to_ms"] for row in rows],
                     [row["predicted_to_ms"] for row in rows],
                     label=f"{pair['model']}: {pair['ranks_from']} -> {pair['ranks_to']} ranks")
    top = max(max(row["measured_to_ms"], row["predicted_to_ms"])
              for pair in report["pairs"] for row in pair["rows"]) * 1.1
    line = [0, top]
    axis.plot(line, line, color="black", linewidth=1)
    axis.fill_between(line, [(1 - WITHIN) * x for x in line], [(1 + WITHIN) * x for x in line],
                      color="grey", alpha=0.2, label=f"within {WITHIN:.0%}")
    axis.set(xlabel="measured ms per iteration", ylabel="predicted ms per iteration",
             xlim=(0, top), ylim=(0, top),
             title="Predicted from the other size's profiles")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed results.json differs from a fresh one")
    parser.add_argument("--pair", nargs=4, action="append", metavar=("LABEL", "FEWER", "MORE",
                                                                     "PROFILES"),
                        help="instead of the committed pairs: two jobs' folders (relative to "
                        "the repository) and `floor` or their profiles' subfolder; repeatable")
    parser.add_argument("--out", default=OUT, help=f"report folder (default {OUT})")
    parser.add_argument("--command", default=COMMAND, help="the command to record")
    args = parser.parse_args(argv)
    report = compute(ROOT, tuple(tuple(pair) for pair in args.pair) if args.pair else PAIRS,
                     args.command)
    out = ROOT / args.out
    path = out / "results.json"
    if args.check:
        if not path.is_file() or _load(path) != report:
            print(f"{args.out}/results.json differs from the jobs' predictions: run "
                  f"{args.command}", file=sys.stderr)
            return 1
        return 0
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(render(report) + "\n", encoding="utf-8")
    try:
        if any(pair["rows"] for pair in report["pairs"]):
            plot(report, out / "cross_size.png")
    except ImportError:  # matplotlib is a test extra: the numbers stand without the plot
        print("cross_size_report: matplotlib is not installed; no plot", file=sys.stderr)
    print(f"cross_size_report: wrote {args.out}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
