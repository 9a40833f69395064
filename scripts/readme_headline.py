"""Renders README.md's headline tables from the committed benchmark reports.

The tables sit between `<!-- headline:begin -->` and `<!-- headline:end -->` in README.md. The
real models come first, from benchmarks/real/{resnet50,vgg16,bert,gpt2}/*/results.json (written
by scripts/bench_real.sh), each row naming the job whose report holds its command; then the
built-in ones, from benchmarks/overlap/cnn/results.json and
benchmarks/overlap/transformer/results.json (scripts/bench_overlap.sh). Never typed by hand:
tests/docs/test_readme.py fails when the README's tables differ from what this script renders.

    python3 scripts/readme_headline.py          # rewrite the table in README.md
    python3 scripts/readme_headline.py --check  # exit 1 if README.md is out of date

Standard library only: it runs from the checkout, with or without commsched installed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN = "<!-- headline:begin -->"
END = "<!-- headline:end -->"
COMMAND = "CNN_RATE=1gbit TRANSFORMER_RATE=1gbit scripts/bench_overlap.sh"
# Every scripts/bench_real.sh command that wrote into the real models' reports, in order.
REAL_COMMANDS = "benchmarks/real/commands.txt"
# (label, report) in the order of the table.
REPORTS = (("CNN", "benchmarks/overlap/cnn/results.json"),
           ("Transformer", "benchmarks/overlap/transformer/results.json"))
# (label, folder of its jobs' reports, the link they ran on) in the order of the table.
REAL = (("ResNet-50", "benchmarks/real/resnet50", "2gbit"),
        ("VGG-16", "benchmarks/real/vgg16", "10gbit"),
        ("BERT-base", "benchmarks/real/bert", "3gbit"),
        ("GPT-2 124M", "benchmarks/real/gpt2", "6gbit"))
# Policies that keep Horovod's semantics: step() waits for every block.
SYNCHRONOUS = ("horovod", "ddp", "mgwfbp")
OVERLAP = ("bytescheduler", "prophet", "dear")


def policy_of(candidate: str) -> str:
    """`commsched:bytescheduler?partition_bytes=2MiB#control` -> `bytescheduler`."""
    return candidate.split(":", 1)[1].split("?", 1)[0].split("#", 1)[0]


def rows_of(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The four rows of one model: hvd, DDP, the fastest synchronous commsched policy, auto."""
    by_name = {row["name"]: row for row in report["rows"]}
    synchronous = [row for row in report["rows"]
                   if row["name"].startswith("commsched:") and "#" not in row["name"]
                   and policy_of(row["name"]) in SYNCHRONOUS]
    if not synchronous:
        raise ValueError(f"no synchronous commsched candidate in {report['meta']['command']!r}")
    best = min(synchronous, key=lambda row: row["median_ms"])
    auto = report["bound"]["auto"][0]
    return [("`hvd` (Horovod's own optimizer)", by_name["hvd"]),
            ("PyTorch DDP", by_name["torch-ddp"]),
            (f"commsched `{policy_of(best['name'])}` (fastest synchronous policy)", best),
            (f"commsched `auto` (kept `{auto['auto_policy']}`)", by_name[auto["auto"]])]


def _fastest(rows: list[tuple[dict[str, Any], dict[str, Any]]],
             policies: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    mine = [(row, job) for row, job in rows if row["name"].startswith("commsched:")
            and "#" not in row["name"] and policy_of(row["name"]) in policies]
    return min(mine, key=lambda item: item[0]["vs_hvd"])


def real_rows(jobs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """A real model's five rows (name, row, its job's report): hvd and DDP from the job that
    has DDP, the fastest synchronous and overlap policies and auto, each from its own job."""
    rows = [(row, job) for job in jobs for row in job["rows"]]
    baseline = next(job for job in jobs if any(r["name"] == "torch-ddp" for r in job["rows"]))
    by_name = {row["name"]: row for row in baseline["rows"]}
    sync, sync_job = _fastest(rows, SYNCHRONOUS)
    overlap, overlap_job = _fastest(rows, OVERLAP)
    auto_job = next(job for job in jobs if job["bound"].get("auto"))
    auto = auto_job["bound"]["auto"][0]
    auto_row = next(row for row in auto_job["rows"] if row["name"] == auto["auto"])
    return [("`hvd` (Horovod's own optimizer)", by_name["hvd"], baseline),
            ("PyTorch DDP", by_name["torch-ddp"], baseline),
            (f"commsched `{policy_of(sync['name'])}` (fastest synchronous policy)", sync,
             sync_job),
            (f"commsched `{policy_of(overlap['name'])}` (fastest overlap policy)", overlap,
             overlap_job),
            (f"commsched `{auto['auto'].removeprefix('commsched:')}` (kept "
             f"`{auto['auto_policy']}`)", auto_row, auto_job)]


def _jobs(root: pathlib.Path, folder: str, link: str) -> list[dict[str, Any]]:
    jobs = []
    for path in sorted((root / folder).glob("*/results.json")):
        job = json.loads(path.read_text(encoding="utf-8"))
        meta = job["meta"]
        if meta["world_size"] != 2 or meta["network"] != f"loopback shaped to {link}":
            raise ValueError(f"{folder}: a job not of 2 ranks at {link} ({meta['world_size']} "
                             f"ranks, {meta['network']})")
        job["report"] = path.with_name("results.md").relative_to(root).as_posix()
        jobs.append(job)
    return jobs


def _ratio(row: dict[str, Any], key: str, mark: str) -> str:
    value = row.get(key)
    return "-" if value is None else f"{mark}{value:.3f}x{mark}"


def _settings(command: str) -> dict[str, str]:
    """The `NAME=value` assignments that open a scripts/bench_real.sh command line."""
    settings = {}
    for word in shlex.split(command):
        name, equals, value = word.partition("=")
        if not equals:
            break
        settings[name] = value
    return settings


def real_commands(root: pathlib.Path = ROOT) -> list[str]:
    """The commands of benchmarks/real/commands.txt that wrote a report of the headline: 2 ranks
    (the other counts write elsewhere) and a model at the link the headline shows it on (a run
    at another speed was moved aside, e.g. benchmarks/real/gpt2-4gbit/)."""
    lines = (root / REAL_COMMANDS).read_text(encoding="utf-8").splitlines()
    shown = {pathlib.PurePosixPath(folder).name: link for _, folder, link in REAL}
    kept = []
    for line in filter(str.strip, lines):
        settings = _settings(line)
        models = settings.get("MODELS", "").split()
        if settings.get("RANKS") == "2" and any(
                model in models and settings.get(f"{model.upper()}_RATE") == link
                for model, link in shown.items()):
            kept.append(line)
    return kept


def render_real(root: pathlib.Path = ROOT) -> list[str]:
    """The real models' table and the lines under it."""
    lines = ["| model | candidate | ms per iteration | vs `hvd` of its job | vs DDP | job |",
             "|---|---|---:|---:|---:|---|"]
    waits, best, autos = [], [], []
    for label, folder, link in REAL:
        rows = real_rows(_jobs(root, folder, link))
        for name, row, job in rows:
            mark = "**" if "(fastest overlap policy)" in name or "`auto" in name else ""
            group = job["report"].split("/")[-2]
            lines.append(f"| {label} | {name} | {row['median_ms']:.1f} | "
                         f"{_ratio(row, 'vs_hvd', mark)} | {_ratio(row, 'vs_torch-ddp', mark)} | "
                         f"[{group}]({job['report']}) |")
        waits.append(f"{rows[0][2]['bound']['hvd_waiting_fraction']:.0%} on {label} ({link})")
        fastest = min(rows[2:], key=lambda item: item[1]["vs_hvd"])
        best.append(f"{fastest[1]['vs_hvd']:.3f}x on {label} ({fastest[0].split(' ')[1]})")
        autos.append(f"{rows[4][1]['vs_hvd']:.3f}x on {label}")
    # One list item per command: a paragraph of them all outgrows the README's style rules.
    commands = [f"{i}. `{command}`" for i, command in enumerate(real_commands(root), start=1)]
    return [f"On the real models, the fastest commsched policy took {', '.join(best)} of "
            f"`hvd`'s time; `auto` took {', '.join(autos)}.", ""] + lines + [
        "",
        f"Median iteration time, 2 ranks, full-size gradients and reduced inputs "
        f"(docs/examples.md). `hvd` waits on the network for {', '.join(waits)}. Models over "
        "100 M parameters ran in three jobs (memory); each ratio is against the `hvd` of its own "
        "job, whose report (the last column) gives its exact command and commit. Rendered from "
        "`benchmarks/real/` (its README has every candidate).", "",
        "Commands, one after another:", "", *commands, ""]


def render(root: pathlib.Path = ROOT) -> str:
    """The text between the markers, markers excluded, newline-terminated lines."""
    lines = ["| model | candidate | ms per iteration | vs `hvd` | vs DDP |",
             "|---|---|---:|---:|---:|"]
    waits, leads = [], []
    for label, path in REPORTS:
        report = json.loads((root / path).read_text(encoding="utf-8"))
        meta = report["meta"]
        if meta["world_size"] != 2 or meta["network"] != "loopback shaped to 1gbit":
            raise ValueError(f"{path}: not 2 ranks at 1gbit ({meta['world_size']} ranks, "
                             f"{meta['network']})")
        for name, row in rows_of(report):
            mark = "**" if name.startswith("commsched `auto`") else ""
            ratios = [f"{mark}{row[key]:.3f}x{mark}" for key in ("vs_hvd", "vs_torch-ddp")]
            lines.append(f"| {label} | {name} | {row['median_ms']:.1f} | {' | '.join(ratios)} |")
        waits.append(f"{report['bound']['hvd_waiting_fraction']:.0%} ({label})")
        auto = rows_of(report)[-1][1]
        leads.append(f"{auto['vs_hvd']:.3f}x `hvd`'s time and {auto['vs_torch-ddp']:.3f}x "
                     f"DDP's on the {label}")
    sources = " and ".join(f"`{path}`" for _, path in REPORTS)
    lines = render_real(root) + [
        f"On the built-in models, `auto` took {', and '.join(leads)}.", ""] + lines
    lines += ["",
              f"Median iteration time, 2 ranks, loopback shaped to 1 Gbit/s. `hvd` waits on the "
              f"network for {' and '.join(waits)} of its iteration.",
              f"Rendered by `scripts/readme_headline.py` from {sources}.",
              f"Command: `{COMMAND}`."]
    return "\n".join(lines) + "\n"


def splice(readme: str, block: str) -> str:
    """README text with the block between the markers replaced."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    if end < start:
        raise ValueError("README.md: the headline's end marker comes before its begin marker")
    return readme[:start] + "\n" + block + readme[end:]


def current(readme: str) -> str:
    """The block between the markers as it stands."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[start:end].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if README.md's headline differs from the rendered one")
    args = parser.parse_args(argv)
    path = ROOT / "README.md"
    readme = path.read_text(encoding="utf-8")
    updated = splice(readme, render())
    if args.check:
        if updated != readme:
            print("README.md: the headline differs from scripts/readme_headline.py's rendering; "
                  "run python3 scripts/readme_headline.py", file=sys.stderr)
            return 1
        return 0
    if updated != readme:
        path.write_text(updated, encoding="utf-8")
        print("readme_headline: README.md updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
