"""Renders README.md's headline table from the committed overlap reports.

The table sits between `<!-- headline:begin -->` and `<!-- headline:end -->` in README.md. It
is made from benchmarks/overlap/cnn/results.json and benchmarks/overlap/transformer/results.json
(written by scripts/bench_overlap.sh), never typed by hand. tests/unit/test_readme.py fails when
the README's table differs from what this script renders.

    python3 scripts/readme_headline.py          # rewrite the table in README.md
    python3 scripts/readme_headline.py --check  # exit 1 if README.md is out of date

Standard library only: it runs from the checkout, with or without commsched installed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN = "<!-- headline:begin -->"
END = "<!-- headline:end -->"
COMMAND = "CNN_RATE=1gbit TRANSFORMER_RATE=1gbit scripts/bench_overlap.sh"
# (label, report) in the order of the table.
REPORTS = (("CNN", "benchmarks/overlap/cnn/results.json"),
           ("Transformer", "benchmarks/overlap/transformer/results.json"))
# Policies that keep Horovod's semantics: step() waits for every block.
SYNCHRONOUS = ("horovod", "ddp", "mgwfbp")


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
    lines = [f"Where the network is the bottleneck, `auto` took {', and '.join(leads)}.",
             ""] + lines
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
