"""One profile for the whole world, from every rank's: the collectives of the rank the others wait
for, and the compute of every rank, iteration by iteration (gathered by `gather_critical` and
`world_document`, which all ranks call together)."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ...world import World

T = TypeVar("T")

# Note [The rank the others wait for]
# A collective starts when its last rank launches it, so the ranks that launched earlier time that
# wait as part of the block (Note [A collective's cost is its typical iteration's] in
# collective_fit.py), and where one rank is behind throughout (its backward is slower, or its core
# is shared with more threads) every block on every other rank holds the lag: one lag, which their
# profiles charge once per block. The collectives that describe the iteration are those of the rank
# the others wait for: its blocks waited least, so their service times are the transfers. It is the
# rank whose collectives of a typical iteration took the least time in all (the lowest rank among
# equals, rank 0 where nothing was timed). Plans, `auto` and the benchmarks' predictions are made
# from its profile, with the compute of Note [Every rank's gradients]. Re-simulated from the
# profiles of every rank kept by six runs (2 ranks, CNN and Transformer at 1 Gbit/s, and the CNN on
# 3 ranks): the CNN's PowerSGD plans, predicted high from rank 0's profile under `horovod` and
# `prophet`, came within a few percent, and the compressed and uncompressed predictions alike
# stayed within a few percent in the median (figures: benchmarks/notes/README.md, 'The rank the
# others wait for').
#
# Note [Every rank's gradients]
# A gradient's collective cannot start before the last rank has that gradient, and which rank
# is last changes from one iteration to the next: on 2 ranks sharing 2 cores a Transformer's
# backward took a little longer on one rank than on the other in the median, while the later of
# the two, iteration by iteration, took longer in the median than either (figures:
# benchmarks/notes/README.md, 'Every rank's gradients'). A profile of one rank, even the slower
# one, misses that difference, and the simulator charged it nowhere: nearly all predictions of
# the simulator validation were short. So the profile that plans and
# predicts takes each gradient's ready time as the median over the sampled iterations of the
# latest time, over the ranks, at which it was ready, counted from the end of the previous
# step() (the compute before the first gradient plus the time since it; the end of step() is
# common to every rank under a synchronous plan, and within a block's transfer of it under an
# overlap one). The ranks sample the same iterations (the engine's sampling follows its round
# count, the same on every rank), so their rows align from the latest one back.


def waited_s(samples_by_op: Mapping[str, Sequence[Sequence[float]]]) -> float:
    """The collectives' service time of a typical iteration: `Profiler.samples_by_op`, or a
    profile document's (`document_samples`)."""
    return sum(float(sample[1]) for samples in samples_by_op.values() for sample in samples)


def document_samples(document: dict) -> dict[str, list[list[float]]]:
    return {op: entry.get("samples") or []
            for op, entry in (document.get("collectives") or {}).items()}


def critical_rank(waited: Sequence[float]) -> int:
    """Of every rank's `waited_s`, the rank the others wait for (Note [The rank the others wait
    for])."""
    return min(range(len(waited)), key=lambda rank: (waited[rank], rank))


@dataclass(frozen=True)
class IterationRow:
    """One sampled iteration on one rank: the compute before its first gradient (seconds from
    the end of the previous step(), waits and deferred updates excluded), and each tensor's
    ready time from that first gradient (-1 where the tensor was not marked ready)."""

    before_first_ready_s: float
    ready_s: tuple[float, ...]


@dataclass(frozen=True)
class WorldCompute:
    """Note [Every rank's gradients]: the compute before the first gradient and each tensor's
    ready time from it (None where no rank marked it), as the world's collectives see them."""

    before_first_ready_s: float
    ready_times: tuple[float | None, ...]


def _latest_ready(rows: Sequence[IterationRow]) -> list[float | None]:
    """Per tensor, the latest time from the end of step() at which a rank had it ready."""
    latest: list[float | None] = []
    for tensor in range(len(rows[0].ready_s)):
        times = [row.before_first_ready_s + row.ready_s[tensor] for row in rows
                 if row.ready_s[tensor] >= 0]
        latest.append(max(times) if times else None)
    return latest


def world_compute(rows_by_rank: Sequence[Sequence[IterationRow]]) -> WorldCompute | None:
    """Note [Every rank's gradients], over the iterations every rank sampled (each rank's
    `Profiler.iteration_rows`: those that describe the plan running now); None for a world of
    one, or where no iteration has every rank's figures."""
    if len(rows_by_rank) < 2:
        return None
    count = min(len(rows) for rows in rows_by_rank)
    iterations = [[rows[len(rows) - count + i] for rows in rows_by_rank] for i in range(count)]
    iterations = [ranks for ranks in iterations
                  if all(row.before_first_ready_s >= 0 for row in ranks)
                  and len({len(row.ready_s) for row in ranks}) == 1]
    if not iterations:
        return None
    firsts, ready = [], []
    for ranks in iterations:
        latest = _latest_ready(ranks)
        marked = [t for t in latest if t is not None]
        if not marked:
            continue
        first = min(marked)
        firsts.append(first)
        ready.append([None if t is None else t - first for t in latest])
    if not firsts:
        return None
    per_tensor = []
    for tensor in range(len(ready[0])):
        seen = [value for row in ready if (value := row[tensor]) is not None]
        per_tensor.append(statistics.median(seen) if seen else None)
    return WorldCompute(statistics.median(firsts), tuple(per_tensor))


def with_world_compute(document: dict, world: WorldCompute | None) -> dict:
    """A copy of a profile document (docs/profile.md) with the world's compute before the first
    gradient and ready times; the document itself where `world` is None."""
    if world is None:
        return document
    out = copy.deepcopy(document)
    out.setdefault("compute", {})["before_first_ready_s"] = world.before_first_ready_s
    for row in out.get("tensors") or []:
        tensor = row.get("id")
        if isinstance(tensor, int) and 0 <= tensor < len(world.ready_times):
            value = world.ready_times[tensor]
            row["ready_time_s"] = value if value is None or math.isfinite(value) else None
    return out


def gather_critical(world: World, mine: T, samples_by_op: Mapping[str, Sequence[Sequence[float]]],
                    rows: Sequence[IterationRow]) -> tuple[T, WorldCompute | None]:
    """`mine` as the rank the others wait for has it, and the compute of every rank (Note [The
    rank the others wait for], Note [Every rank's gradients]); `samples_by_op` and `rows`: this
    rank's `Profiler.samples_by_op` and `Profiler.iteration_rows()`. All ranks call this
    together."""
    gathered = world.all_gather_object((waited_s(samples_by_op), rows, mine))
    chosen = gathered[critical_rank([w for w, _, _ in gathered])][2]
    return chosen, world_compute([r for _, r, _ in gathered])


def world_document(world: World, document: dict,
                   samples_by_op: Mapping[str, Sequence[Sequence[float]]],
                   rows: Sequence[IterationRow]) -> dict:
    """The profile document of the rank the others wait for, with every rank's compute (this
    rank's `document`, the rest as in `gather_critical`; all ranks call this together)."""
    chosen, compute = gather_critical(world, document, samples_by_op, rows)
    return with_world_compute(chosen, compute)
