"""Compute times the simulator needs, with the fallbacks used when a profile lacks them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..plan.update_groups import UpdateCost
from .profile import RunProfile


def children_seconds(inclusive: dict[str, float | None]) -> dict[str, float]:
    """Per module, the summed inclusive forward time of its direct children (a child's parent
    is its longest name prefix that is itself listed; the root is "")."""
    children: dict[str, float] = {}
    for name, seconds in inclusive.items():
        if name and seconds is not None:
            parent = name.rpartition(".")[0]
            while parent and parent not in inclusive:
                parent = parent.rpartition(".")[0]
            children[parent] = children.get(parent, 0.0) + seconds
    return children


@dataclass(frozen=True)
class ComputeTimes:
    before_first_ready_s: float  # end of step() -> first gradient: data, forward, loss, ...
    step_s: float  # the wrapped optimizer's whole update
    modules: tuple[tuple[str, float], ...]  # forward order: (name, own forward time)
    notes: list[str] = field(default_factory=list)
    update: UpdateCost = UpdateCost()  # one call of the optimizer under an overlap plan

    @property
    def forward_s(self) -> float:
        return sum(seconds for _, seconds in self.modules)


def module_self_times(run: RunProfile) -> tuple[tuple[tuple[str, float], ...], list[str]]:
    """Own forward time per module. A schema-1 profile has only inclusive times: own time is
    then inclusive minus the children's (a child's parent is its longest listed name prefix),
    as the profiler computes it; a module with no time at all counts 0."""
    inclusive = {m.name: m.forward_time_s for m in run.modules}
    children = children_seconds(inclusive)
    rows, derived, unknown = [], 0, 0
    for m in run.modules:
        own = m.self_time_s
        if own is None and m.forward_time_s is not None:
            own = max(m.forward_time_s - children.get(m.name, 0.0), 0.0)
            derived += 1
        elif own is None:
            own = 0.0
            unknown += 1
        rows.append((m.name, own))
    notes = []
    if derived:
        notes.append(f"{derived} modules without self_time_s: own time = forward_time_s minus "
                     "the children's")
    if unknown:
        notes.append(f"{unknown} modules without any forward time count 0 s")
    return tuple(rows), notes


def compute_times(run: RunProfile, with_modules: bool) -> ComputeTimes:
    notes: list[str] = []
    modules: tuple[tuple[str, float], ...] = ()
    if with_modules or run.before_first_ready_s is None:
        modules, module_notes = module_self_times(run)
        if with_modules:
            notes.extend(module_notes)
    before = run.before_first_ready_s
    if before is None:
        # Without the measurement, the forward pass is the best lower bound the profile has.
        before = sum(seconds for _, seconds in modules)
        notes.append("compute.before_first_ready_s missing: taken as the modules' forward time "
                     f"({before * 1e3:.3f} ms; data loading, loss and backward start not counted)")
    step = run.step_s
    if step is None:
        step = 0.0
        notes.append("compute.step_s missing: the optimizer update counts 0 s")
    elif run.update_shards > 1:
        # One rank stepped 1/N of every element: the whole update, as an unsharded plan runs
        # it, takes about N times that (the sharded plan charges its calls from `update`).
        step *= run.update_shards
        notes.append(f"a sharded run's profile: the whole update taken as {run.update_shards}x "
                     "the rank's updates of its slices")
    update = update_cost(run, step, notes if with_modules else [])
    return ComputeTimes(before, step, modules, notes, update)


def update_cost(run: RunProfile, step_s: float, notes: list[str]) -> UpdateCost:
    """The profile's fitted cost of one optimizer call; without it, the whole update's time
    shared by bytes (no fixed cost: an older profile, or one without timed update calls)."""
    if run.update_fixed_s is not None and run.update_per_byte_s is not None:
        return UpdateCost(run.update_fixed_s, run.update_per_byte_s)
    if step_s > 0:
        notes.append("compute.update_fixed_s missing: each update call costs its share of "
                     "step_s by bytes, with no fixed cost")
    return UpdateCost(0.0, step_s / max(run.total_bytes, 1))


@dataclass(frozen=True)
class CompressorCompute:
    """A lossy compressor's training-thread time (Note [Simulated compression compute],
    sim/compressed.py): it starts when backward ended and the blocks holding `waited_for`
    are done; the blocks holding `after` are launched when it ends."""

    seconds: float
    waited_for: frozenset[int] = frozenset()
    after: frozenset[int] = frozenset()
    # Gradient id -> its wire tensors (WireLayout.carriers): an overlap plan's update of it
    # waits for their blocks.
    carriers: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
