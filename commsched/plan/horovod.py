"""Horovod's tensor fusion, as a static plan.

Horovod's background thread wakes every cycle (HOROVOD_CYCLE_TIME), takes the tensors that became
ready since the last cycle in ready order, and fuses them into buffers of at most
HOROVOD_FUSION_THRESHOLD bytes, one dtype per buffer. Here the cycles are applied to the
*profiled* ready times, so every rank derives the same blocks.
"""

from __future__ import annotations

import math

from ..config import Config, Policy
from .types import Block, Profile, TensorSpec
from .units import Unit, blocks_from_unit_lists, units_in_ready_order


def _cycle_of(unit: Unit, cycle_seconds: float) -> float:
    if cycle_seconds <= 0:
        return unit.ready
    return math.floor(unit.ready / cycle_seconds + 1e-9)


def fuse_by_threshold(units: list[Unit], threshold: int) -> list[list[Unit]]:
    """Greedy fusion in order, one open buffer per dtype; a unit that does not fit closes its
    dtype's buffer. A unit larger than the threshold travels alone."""
    buffers: list[list[Unit]] = []
    open_buffer: dict[str, tuple[list[Unit], int]] = {}
    for unit in units:
        current = open_buffer.get(unit.dtype)
        if current is not None and current[1] + unit.nbytes <= threshold:
            current[0].append(unit)
            open_buffer[unit.dtype] = (current[0], current[1] + unit.nbytes)
            continue
        fresh = [unit]
        buffers.append(fresh)
        open_buffer[unit.dtype] = (fresh, unit.nbytes)
    return buffers


def plan_horovod(specs: list[TensorSpec], profile: Profile, cfg: Config) -> tuple[Block, ...]:
    cycle_seconds = cfg.cycle_time / 1000.0
    cycles: dict[float, list[Unit]] = {}
    for unit in units_in_ready_order(specs, profile):
        cycles.setdefault(_cycle_of(unit, cycle_seconds), []).append(unit)
    unit_lists: list[list[Unit]] = []
    for cycle in sorted(cycles):
        unit_lists.extend(fuse_by_threshold(cycles[cycle], cfg.fusion_bytes(Policy.HOROVOD)))
    return blocks_from_unit_lists(unit_lists)
