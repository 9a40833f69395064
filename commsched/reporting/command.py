"""`python -m commsched report RUN_DIR`: the command line around the analysis (see
commsched.reporting.analysis for what each figure means)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..bandwidth import UnitError, parse_bandwidth
from ..outputs import OutputPathError, prepare_file
from . import analysis
from .analysis import ReportError, build_report
from .output import markdown, plot_iteration


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m commsched report",
                                     description=analysis.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="directory with timeline.rank<N>.json (and profile.json)")
    parser.add_argument("--link", help="link bandwidth per rank, e.g. 1gbit")
    parser.add_argument("--skip", type=int, help="iterations to ignore at the start (default: "
                        "those that began before the last plan mark)")
    parser.add_argument("--plot", help="PNG of one iteration (default RUN_DIR/report.png)")
    parser.add_argument("--json", dest="json_path", help="write the report as JSON here")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help or a usage error: argparse already printed it
        return int(exc.code or 0)
    try:
        link = parse_bandwidth(args.link) if args.link else None
    except UnitError as exc:
        print(f"report: --link: {exc}", file=sys.stderr)
        return 2
    if args.skip is not None and args.skip < 0:
        print("report: --skip must be >= 0", file=sys.stderr)
        return 2
    try:  # before any work: a path that cannot be written is one line, not a late traceback
        if args.plot:
            prepare_file(args.plot, "--plot")
        if args.json_path:
            prepare_file(args.json_path, "--json")
    except OutputPathError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    try:
        report, traces = build_report(args.run_dir, args.skip, link)
    except ReportError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    report["plot"] = args.plot or os.path.join(args.run_dir, "report.png")
    try:
        try:
            plot_iteration(traces, report, report["plot"])
        except ImportError:  # matplotlib is optional (a test extra): the numbers still stand
            print("report: matplotlib is not installed; no plot written", file=sys.stderr)
            report["plot"] = None
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as handle:
                json.dump(report, handle, indent=1)
    except OSError as exc:
        print(f"report: {exc.filename}: cannot write: {exc.strerror}", file=sys.stderr)
        return 2
    print(markdown(report))
    if report["plot"]:
        print(f"\nplot: {report['plot']}")
    return 0
