"""MG-WFBP dynamic tensor fusion (Shi et al.; the factor fusion of SPD-KFAC).

Walk gradients in ready order. Communication of group l starts at
    tau[l] = max(tau[l-1] + t(n[l-1]), r[l])
Group l is merged with the next group when the next one is ready before l's communication would
end, and merging costs less than it saves: either l would not have started by then anyway, or
the wait r[next] - tau[l] is below the start-up latency alpha that merging saves. After a merge
the start times are recomputed. Groups of different dtypes never merge (one buffer, one dtype).

Note [MG-WFBP fuses up to the fusion threshold]
The rule above counts only the wire, where merging is free once the link is busy. A fused group
is also copied into a fusion buffer and back out of it, while a group of one tensor is reduced
in place. Unbounded, the rule fused VGG-16's 16 KB classifier bias into its 411 MB weight
(ready together, so "not started yet") and GPT-2's whole backward into a few groups of up to
328 MB: each iteration then copied every fused byte twice to save a few start-up latencies
(benchmarks/real/README.md). So a merge never makes a group larger than `fusion_threshold`, the
bound Horovod puts on its fusion buffer: a larger tensor travels alone, and 0 disables fusion.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config, Policy
from .types import Block, NetModel, Profile, TensorSpec
from .units import Unit, blocks_from_unit_lists, units_in_ready_order


@dataclass
class _Group:
    units: list[Unit]
    ready: float
    nbytes: int
    dtype: str


def _start_times(groups: list[_Group], net: NetModel) -> list[float]:
    starts: list[float] = []
    for i, group in enumerate(groups):
        earliest = starts[i - 1] + net.time(groups[i - 1].nbytes) if i else group.ready
        starts.append(max(earliest, group.ready))
    return starts


def should_merge(current: _Group, start: float, following: _Group, net: NetModel,
                 limit: int) -> bool:
    if current.dtype != following.dtype or current.nbytes + following.nbytes > limit:
        return False
    ends_after_next_ready = following.ready < start + net.time(current.nbytes)
    not_started_yet = start >= following.ready
    short_wait = following.ready - start < net.alpha
    return ends_after_next_ready and (not_started_yet or short_wait)


def merge_groups(units: list[Unit], net: NetModel, limit: int) -> list[list[Unit]]:
    """The groups of `units` (in ready order) under the rule above, none over `limit` bytes
    (Note [MG-WFBP fuses up to the fusion threshold])."""
    groups = [_Group([u], u.ready, u.nbytes, u.dtype) for u in units]
    i = 0
    while i < len(groups) - 1:
        starts = _start_times(groups, net)
        if should_merge(groups[i], starts[i], groups[i + 1], net, limit):
            nxt = groups.pop(i + 1)
            groups[i] = _Group(groups[i].units + nxt.units, nxt.ready,
                               groups[i].nbytes + nxt.nbytes, nxt.dtype)
            # The merged group starts later: the previous group may now want to merge with it.
            i = max(i - 1, 0)
        else:
            i += 1
    return [g.units for g in groups]


def plan_mgwfbp(specs: list[TensorSpec], profile: Profile, net: NetModel,
                cfg: Config) -> tuple[Block, ...]:
    return blocks_from_unit_lists(merge_groups(units_in_ready_order(specs, profile), net,
                                               cfg.fusion_bytes(Policy.MGWFBP)))
