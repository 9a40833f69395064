"""Which rank computes each factor's inverse (or eigendecomposition).

SPD-KFAC places every decomposition above a size threshold on one worker, longest processing
time first on a d^3 cost, so the slowest worker finishes as early as a greedy schedule allows
(Graham's bound: within 4/3 - 1/(3p) of the optimum). Smaller ones are cheaper to recompute
everywhere than to send. Pure functions: every rank computes the same assignment from the same
(name, dimension) list.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

LOCAL = -1  # computed on every rank, nothing sent


class Placement(enum.StrEnum):
    LPT = "lpt"
    ROUND_ROBIN = "round_robin"


def decomposition_cost(dim: int) -> float:
    return float(dim) ** 3


def lpt(costs: Sequence[float], workers: int) -> list[int]:
    """Longest processing time first: largest task to the least-loaded worker (ties: the lower
    task index first, the lower worker)."""
    if workers < 1:
        raise ValueError(f"lpt needs at least one worker, got {workers}")
    loads = [0.0] * workers
    owners = [0] * len(costs)
    for task in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        owners[task] = worker
        loads[worker] += costs[task]
    return owners


def round_robin(count: int, workers: int) -> list[int]:
    if workers < 1:
        raise ValueError(f"round_robin needs at least one worker, got {workers}")
    return [i % workers for i in range(count)]


def makespan(costs: Sequence[float], owners: Sequence[int], workers: int) -> float:
    loads = [0.0] * workers
    for cost, owner in zip(costs, owners, strict=True):
        loads[owner] += cost
    return max(loads) if loads else 0.0


@dataclass(frozen=True)
class Assignment:
    """owner[name] is a rank, or LOCAL for a decomposition every rank computes itself."""

    owner: dict[str, int]
    dims: dict[str, int]
    workers: int

    def owned_by(self, rank: int) -> list[str]:
        return [name for name, owner in self.owner.items() if owner == rank]

    @property
    def local(self) -> list[str]:
        return self.owned_by(LOCAL)

    def load(self, rank: int) -> float:
        return sum(decomposition_cost(self.dims[name]) for name in self.owned_by(rank))

    def describe(self) -> str:
        parts = [f"rank {r}: {', '.join(self.owned_by(r)) or '-'} (cost {self.load(r):.3g})"
                 for r in range(self.workers)]
        return "; ".join(parts) + f"; every rank: {', '.join(self.local) or '-'}"


def assign(dims: Sequence[tuple[str, int]], workers: int, placement: Placement,
           local_threshold: int) -> Assignment:
    """Places the decompositions of dimension > local_threshold; `dims` is in layer order."""
    placed = [(name, dim) for name, dim in dims if dim > local_threshold]
    costs = [decomposition_cost(dim) for _, dim in placed]
    if placement is Placement.LPT:
        owners = lpt(costs, workers)
    else:
        owners = round_robin(len(placed), workers)
    owner = {name: LOCAL for name, _ in dims}
    owner.update({name: rank for (name, _), rank in zip(placed, owners, strict=True)})
    return Assignment(owner, dict(dims), workers)
