"""``python -m commsched simulate``: what-if table of predicted iteration time per policy.

Errors in the arguments or the profile print one line and return exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..bandwidth import UnitError, parse_bandwidth
from ..compression import LossyCompression
from ..config import Policy, load_config
from ..outputs import OutputPathError, prepare_file
from .compressed import CompressorError, parse_compressor
from .network import Algorithm
from .profile import (
    BUILTIN_PROFILES,
    ProfileError,
    RunProfile,
    profile_from_document,
    read_document,
)
from .rank import allowed_policies, planned_policies
from .tables import markdown, table
from .whatif import COMPRESSION_CAP, TARGET_SCALING, LinkSpec, Row, fitted_rows, sweep

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class UsageError(ValueError):
    pass


def parse_seconds(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _TIME_UNITS | {"": 1.0}:
        raise UsageError(f"latency {text!r}: expected a number of seconds with an optional unit "
                         "(s, ms, us, ns), e.g. 20us")
    return float(match.group(1)) * _TIME_UNITS.get(match.group(2), 1.0)


def _items(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{what} {text!r}: expected a comma-separated list")
    return items


def parse_workers(text: str) -> list[int]:
    out = []
    for item in _items(text, "--workers"):
        if not item.isdigit() or int(item) < 1:
            raise UsageError(f"--workers {item!r}: expected whole numbers >= 1, e.g. 8,16,64")
        out.append(int(item))
    return out


def parse_compressions(text: str) -> list[float | LossyCompression]:
    """Ratios (e.g. 1,2,5) and named compressors (powersgd:RANK, topk:RATIO), mixed freely."""
    out: list[float | LossyCompression] = []
    for item in _items(text, "--compression"):
        if ":" in item:
            try:
                out.append(parse_compressor(item))
            except CompressorError as err:
                raise UsageError(str(err)) from None
            continue
        try:
            value = float(item)
        except ValueError:
            value = float("nan")
        if not 1.0 <= value <= COMPRESSION_CAP:
            raise UsageError(f"--compression {item!r}: expected ratios between 1 and "
                             f"{COMPRESSION_CAP:g} (e.g. 1,2,5) or compressors "
                             "powersgd:RANK, topk:RATIO (e.g. powersgd:4,topk:0.01)")
        out.append(value)
    return out


def parse_policies(text: str) -> list[Policy] | None:
    """None for `all`: every policy the profile can simulate."""
    if text.strip().lower() == "all":
        return None
    known = {p.value: p for p in planned_policies()}
    out = []
    for item in _items(text, "--policy"):
        if item.lower() not in known:
            raise UsageError(f"--policy {item!r}: expected 'all' or a list of "
                             + ", ".join(known))
        out.append(known[item.lower()])
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m commsched simulate",
        description="Predicted iteration time per policy from a profile, over workers x "
                    "bandwidth x compression (docs/simulator.md).")
    p.add_argument("--profile", required=True, help="profile JSON (COMMSCHED_PROFILE) or a "
                   f"built-in name ({', '.join(BUILTIN_PROFILES)}); several, comma-separated")
    p.add_argument("--workers", default="8,16,64", help="worker counts (default 8,16,64)")
    p.add_argument("--bandwidth", default="10gbit,25gbit,100gbit",
                   help="link bandwidth per worker, e.g. 10gbit, 1250mbit, 3gbps")
    p.add_argument("--latency", default="20us", help="per-message latency alpha (default 20us)")
    p.add_argument("--algorithm", default="ring", choices=[a.value for a in Algorithm])
    p.add_argument("--policy", default="all", help="'all' or a comma-separated list")
    p.add_argument("--compression", default="1",
                   help="compression ratios and/or compressors, comma-separated (default 1): "
                        "a ratio divides every collective's bytes; powersgd:RANK or "
                        "topk:RATIO simulate that compressor's real wire tensors and compute")
    p.add_argument("--target", type=float, default=TARGET_SCALING,
                   help="scaling factor the compression search aims at (default 0.9)")
    p.add_argument("--knobs", choices=("grid", "default"), default="grid",
                   help="grid: each policy at its best knobs from a small grid; default: the "
                        "configured knobs only")
    p.add_argument("--fitted", action="store_true", help="use the profile's fitted network at "
                   "its own world size instead of --workers/--bandwidth")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--plot", help="PNG: scaling factor of horovod vs the fastest policy")
    p.add_argument("--timeline", help="PNG: simulated timelines of the first scenario")
    p.add_argument("--markdown", help="write the summary and the full table as Markdown here")
    return p


def _policies_for(asked: list[Policy] | None, run: RunProfile, name: str) -> list[Policy]:
    possible = allowed_policies(run, overlap_allowed=True)
    if asked is None:
        return possible
    missing = [p.value for p in asked if p not in possible]
    if missing:
        raise UsageError(f"profile {name}: {', '.join(missing)} need module information "
                         "(modules and tensors[].module: a profile recorded with model=)")
    return asked


def run_command(args: argparse.Namespace) -> int:
    if not 0 < args.target <= 1:
        raise UsageError(f"--target {args.target}: expected a scaling factor in (0, 1]")
    workers = parse_workers(args.workers)
    bandwidths = [parse_bandwidth(b) for b in _items(args.bandwidth, "--bandwidth")]
    latency = parse_seconds(args.latency)
    ratios = parse_compressions(args.compression)
    asked = parse_policies(args.policy)
    links = [LinkSpec(p, bw, latency, Algorithm(args.algorithm))
             for p in workers for bw in bandwidths]
    base = load_config({}, environ={})
    tune = args.knobs == "grid"
    models: dict[str, list[Row]] = {}
    summary: dict[str, dict] = {}
    for name in _items(args.profile, "--profile"):
        doc, source = read_document(name)
        run = profile_from_document(doc, source)
        policies = _policies_for(asked, run, name)
        notes: list[str] = []
        if args.fitted:
            named = tuple(v for v in ratios if not isinstance(v, float))
            t1, rows, notes = fitted_rows(name, run, doc, base, policies, tune, named)
        else:
            t1, rows = sweep(name, run, base, policies, links, ratios, tune, args.target)
        for row in rows:
            assert row.result is not None
            notes.extend(row.result.notes)
        if len(policies) < len(planned_policies()) and asked is None:
            notes.append("overlap policies skipped: the profile has no module information "
                         "(a run records it when it passes model= under an overlap policy or auto)")
        models[name] = rows
        summary[name] = {"compute_only_s": t1, "notes": list(dict.fromkeys(notes)),
                         "rows": [r.as_json() for r in rows]}
        print(f"\n{name}: T1 (no communication) = {t1 * 1e3:.1f} ms")
        for note in summary[name]["notes"]:
            print(f"  note: {note}")
        print(table(rows))
    if args.json:
        doc_out = {"target_scaling": args.target, "compression_cap": COMPRESSION_CAP,
                   "latency_s": latency, "algorithm": args.algorithm, "knobs": args.knobs,
                   "models": summary}
        Path(args.json).write_text(json.dumps(doc_out, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(markdown(models, args.target), encoding="utf-8")
    if args.plot:
        from .plot import plot_scaling

        plot_scaling(models, args.plot, args.target)
    if args.timeline:
        from .plot import best_rows, plot_timelines

        panels = []
        for name, rows in models.items():
            horovod, best = best_rows(rows, rows[0].compression)[0]
            for row in (horovod, best) if best is not horovod else (horovod,):
                assert row.result is not None
                panels.append((f"{name} {row.policy} p={row.workers} "
                               f"{scenario(row)}", row.result))
        plot_timelines(panels, args.timeline)
    return 0


def scenario(row: Row) -> str:
    if row.bandwidth_bytes_per_s is None:
        return "fitted network"
    return f"{row.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s"


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help (0) and on bad arguments (2)
        return int(exit_.code or 0)
    try:
        for what in ("json", "plot", "timeline", "markdown"):
            if getattr(args, what):
                prepare_file(getattr(args, what), f"--{what}")
        return run_command(args)
    except (UsageError, UnitError, ProfileError, OutputPathError, OSError) as err:
        print(f"commsched simulate: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
