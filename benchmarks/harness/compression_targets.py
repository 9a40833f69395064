"""The compression speed report's targets (issue 15, item 6; benchmarks/compression_speed,
scripts/bench_compression_speed.sh): commsched's fastest PowerSGD and top-k candidates against
DDP's PowerSGD hook and uncompressed hvd.

    python -m benchmarks.harness.compression_targets benchmarks/compression_speed/cnn/results.json
"""

from __future__ import annotations

from typing import Any

POWERSGD_TARGETS = {"torch-ddp-powersgd": 0.9, "hvd": 0.6}  # at most this x their median


def _fastest(rows: list[dict[str, Any]], test: Any) -> dict[str, Any] | None:
    chosen = [r for r in rows if test(r["name"])]
    return min(chosen, key=lambda r: r["median_ms"]) if chosen else None


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: commsched's fastest PowerSGD candidate (and top-k's) against DDP's
    PowerSGD hook and uncompressed hvd, with the issue's targets."""
    def commsched_with(kind: str) -> Any:
        return lambda name: name.startswith("commsched:") and f"compression={kind}" in name

    lines = []
    for kind in ("powersgd", "topk"):
        best = _fastest(rows, commsched_with(kind))
        if best is None:
            continue
        for base, limit in POWERSGD_TARGETS.items():
            other = _fastest(rows, lambda name, base=base: name.partition("?")[0] == base)
            if other is None:
                continue
            ratio = best["median_ms"] / other["median_ms"]
            verdict = ("met" if ratio <= limit else "missed") if kind == "powersgd" else "-"
            lines.append(f"* {best['name']} / {other['name']}: {ratio:.2f}x"
                         + (f" (target <= {limit}x: {verdict})" if kind == "powersgd" else ""))
    return lines


def main(argv: list[str]) -> int:
    """`python -m benchmarks.harness.compression_targets RESULTS.json`: the target lines."""
    import json

    for path in argv:
        with open(path, encoding="utf-8") as handle:
            print("\n".join(targets(json.load(handle)["rows"])))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
