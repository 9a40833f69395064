"""PNG output of the simulate command (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .simulator import SimResult
from .whatif import Row

LANES = ("compute", "wait", "network")
COLOURS = {"compute": "#4c72b0", "wait": "#c44e52", "allreduce": "#55a868",
           "reduce_scatter": "#dd8452", "all_gather": "#8172b3"}


def _pyplot() -> Any:  # matplotlib.pyplot, imported on first use
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def best_rows(rows: list[Row], compression: float | str) -> list[tuple[Row, Row]]:
    """(horovod, fastest policy) per scenario at one compression ratio, in sweep order."""
    scenarios: dict[tuple[int, float | None], list[Row]] = {}
    for row in rows:
        if row.compression == compression:
            scenarios.setdefault((row.workers, row.bandwidth_bytes_per_s), []).append(row)
    out = []
    for group in scenarios.values():
        horovod = next((r for r in group if r.policy == "horovod"), None)
        best = min(group, key=lambda r: r.iteration_s)
        out.append((horovod or best, best))
    return out


def scenario_label(row: Row) -> str:
    link = "fitted" if row.bandwidth_bytes_per_s is None \
        else f"{row.bandwidth_bytes_per_s * 8 / 1e9:g}G"
    return f"p={row.workers}\n{link}"


def plot_scaling(models: dict[str, list[Row]], path: str | Path, target: float) -> None:
    """Scaling factor of horovod vs the fastest policy per scenario, one panel per model."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, (model, rows) in zip(axes[0], models.items(), strict=True):
        compression: float | str = rows[0].compression if rows else 1.0
        pairs = best_rows(rows, compression)
        xs = range(len(pairs))
        ax.bar([x - 0.2 for x in xs], [h.scaling for h, _ in pairs], 0.4, label="horovod",
               color="#999999")
        ax.bar([x + 0.2 for x in xs], [b.scaling for _, b in pairs], 0.4,
               label="fastest policy", color="#4c72b0")
        for x, (_, best) in zip(xs, pairs, strict=True):
            ax.text(x + 0.2, best.scaling + 0.01, best.policy, rotation=90, ha="center",
                    va="bottom", fontsize=7)
        ax.axhline(target, color="#c44e52", linestyle="--", linewidth=1, label=f"{target:g}")
        ax.set_xticks(list(xs), [scenario_label(h) for h, _ in pairs], fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_ylabel("scaling factor T1/Tp")
        shown = compression if isinstance(compression, str) else f"{compression:g}"
        title = model if compression == 1 else f"{model} (compression {shown})"
        ax.set_title(title)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timelines(panels: list[tuple[str, SimResult]], path: str | Path) -> None:
    """One simulated iteration per panel: compute, wait and network lanes."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.6 + 1.1 * len(panels)),
                             squeeze=False)
    for ax, (title, result) in zip(axes[:, 0], panels, strict=True):
        for event in result.events:
            lane = LANES.index(event.lane)
            colour = COLOURS.get(event.name if event.lane == "network" else event.lane, "#888888")
            ax.broken_barh([(event.start_s * 1e3, event.duration_s * 1e3)], (lane - 0.4, 0.8),
                           facecolors=colour, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(LANES)), LANES)
        ax.set_xlim(0, result.iteration_s * 1e3)
        ax.set_title(f"{title}: {result.iteration_s * 1e3:.1f} ms", fontsize=9)
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=k) for k, c in COLOURS.items()]
    axes[0, 0].legend(handles=handles, fontsize=7, ncol=len(handles), loc="lower right",
                      bbox_to_anchor=(1.0, 1.12), frameon=False)
    axes[-1, 0].set_xlabel("ms from the end of the previous step()")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
