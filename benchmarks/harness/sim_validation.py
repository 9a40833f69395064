"""The simulator validation's summary (benchmarks/sim_validation, scripts/bench_sim.sh): one
table over the `compare --predict` results of every setting, measured against predicted.

    python -m benchmarks.harness.sim_validation benchmarks/sim_validation/*/results.json
"""

from __future__ import annotations

import json
import statistics

from .measured_vs_predicted import AUTO_TOLERANCE
from .prediction_report import verdicts_of


def load_document(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


TARGET = 0.15  # the bound on each prediction's error


def summary_markdown(result_files: list[str]) -> str:
    """One table over every setting: measured vs predicted per policy, and auto's picks."""
    lines = ["| model | link | candidate | measured ms | predicted ms | error | within 15% |",
             "|---|---|---|---:|---:|---:|---|"]
    within = total = picks = hits = close = 0
    errors: list[float] = []
    for path in result_files:
        doc = load_document(path)
        meta, rows = doc["meta"], doc["rows"]
        for row in rows:
            if row.get("predicted_ms") is None:
                continue
            ok = row["prediction_error"] <= TARGET
            within, total = within + ok, total + 1
            errors.append(row["prediction_error"])
            lines.append(f"| {meta['model']}, {meta.get('world_size', 2)} ranks "
                         f"| {meta.get('network', '')} | {row['name']} "
                         f"| {row['median_ms']:.1f} | {row['predicted_ms']:.1f} "
                         f"| {100 * row['prediction_error']:.0f}% | {'yes' if ok else 'no'} |")
        for verdict in verdicts_of(doc["bound"].get("auto")):
            picks, hits = picks + 1, hits + bool(verdict["picked_fastest"])
            close += bool(verdict.get("auto_within_tolerance"))
    spread = (f" Median error {100 * statistics.median(errors):.1f}%, worst "
              f"{100 * max(errors):.1f}%." if errors else "")
    lines += ["", f"Predictions within 15%: {within} of {total}.{spread} `auto` picked the "
              f"measured-fastest policy in {hits} of {picks} settings, and ran within "
              f"{100 * AUTO_TOLERANCE:.0f}% of the fastest commsched candidate in {close} of "
              f"{picks}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import sys

    files = list(sys.argv[1:] if argv is None else argv)
    print(summary_markdown(files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
