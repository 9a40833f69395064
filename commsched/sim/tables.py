"""Text and Markdown tables of what-if rows."""

from __future__ import annotations

from .plot import best_rows
from .whatif import Row, describe_knobs


def link_text(row: Row) -> str:
    if row.bandwidth_bytes_per_s is None:
        return "fitted"
    return f"{row.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s"


def ratio_text(row: Row) -> str:
    if not row.searched:
        return "-"
    if row.compression_for_target is None:
        return "unreachable"
    return f"{row.compression_for_target:.2f}"


def least_ratio(rows: list[Row], scenario: Row) -> str:
    """The smallest compression any policy needs for the target in `scenario`'s network."""
    same = [r for r in rows if r.searched and r.compression_for_target is not None
            and (r.workers, r.bandwidth_bytes_per_s) == (scenario.workers,
                                                         scenario.bandwidth_bytes_per_s)]
    if not same:
        return "-" if not scenario.searched else "unreachable"
    least = min(same, key=lambda r: (r.compression_for_target or 0.0, r.iteration_s))
    return f"{ratio_text(least)} ({least.policy})"


def compression_text(row: Row) -> str:
    return row.compression if isinstance(row.compression, str) else f"{row.compression:g}"


def _cells(row: Row) -> list[str]:
    return [str(row.workers), link_text(row), compression_text(row), row.policy,
            describe_knobs(row.knobs), f"{row.iteration_s * 1e3:.1f}",
            f"{row.speedup_vs_horovod:.2f}", f"{row.scaling:.3f}",
            "-" if row.utilisation is None else f"{100 * row.utilisation:.0f}%",
            f"{100 * row.busy_fraction:.0f}%", ratio_text(row)]


HEADER = ["workers", "link", "compr", "policy", "knobs", "iter ms", "speed-up", "scaling",
          "net util", "net busy", "compr for target"]


def table(rows: list[Row]) -> str:
    """Aligned plain-text table, one line per row."""
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def _md(lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out)


def summary_lines(models: dict[str, list[Row]], target: float) -> list[list[str]]:
    """Horovod vs the fastest policy per scenario (at the first compression ratio)."""
    lines = [["model", "workers", "link", "horovod scaling", "fastest policy", "its scaling",
              f"horovod: compression for {target:g}", f"fastest: compression for {target:g}",
              f"least compression for {target:g} (policy)"]]
    for model, rows in models.items():
        if not rows:
            continue
        for horovod, best in best_rows(rows, rows[0].compression):
            lines.append([model, str(best.workers), link_text(best), f"{horovod.scaling:.3f}",
                          f"{best.policy} ({describe_knobs(best.knobs)})", f"{best.scaling:.3f}",
                          ratio_text(horovod), ratio_text(best), least_ratio(rows, best)])
    return lines


def markdown(models: dict[str, list[Row]], target: float) -> str:
    parts = ["### Horovod vs the fastest policy\n", _md(summary_lines(models, target)), ""]
    for model, rows in models.items():
        parts += [f"### {model}: every policy\n", _md([HEADER] + [_cells(r) for r in rows]), ""]
    return "\n".join(parts) + "\n"
