"""Turns the engine's timings into a Profile (ready times) and a NetModel (alpha, beta; the fits
themselves are in collective_fit.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...plan import NetModel, Profile, TensorSpec
from ...sim.timing import children_seconds
from ..planning.world_profile import IterationRow
from .collective_fit import fit_alpha_beta, fit_collective, typical_blocks

# The profiler records every iteration (auto re-checks its prediction late in a run); only the
# latest iterations (and of collectives at most KEEP_COLLECTIVE_SAMPLES samples) are kept so that
# a long run's memory stays flat.
KEEP_ITERATIONS = 64
KEEP_COLLECTIVE_SAMPLES = 4096


class TimingEvent(Protocol):
    """What the profiler needs of an event pair timing a stretch of device work (torch.cuda.Event
    with enable_timing=True)."""

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


# Note [Which clock]
# Every figure kind of the profile says which clock it came from: "cpu" (the host's steady
# clock) or "device_event" (events on the device's streams, Note [Device time] in
# csrc/device_clock.cpp). For device tensors, ready times and collective durations come from the
# engine's events and update costs from CUDA events around the optimizer call (UpdateTimer);
# the compute figures (before_first_ready_s, step_s) and module forward times are stretches of
# the training thread on the host's clock (on a device, the host's share: the enqueueing of the
# work) and say "cpu" everywhere.
CPU = "cpu"
DEVICE_EVENT = "device_event"


@dataclass(frozen=True)
class EventSpan:
    """A stretch of device work between two timing events, not necessarily reached yet."""

    start: TimingEvent
    end: TimingEvent


def _keep_last(values: list, limit: int) -> None:
    if len(values) > limit:
        del values[: len(values) - limit]


def _round_size(round_: dict[str, list[tuple[int, float]]]) -> int:
    return sum(len(samples) for samples in round_.values())


def latest_half(values: list) -> list:
    return values[len(values) // 2:]


@dataclass
class Profiler:
    """Collects one record per finished iteration."""

    num_tensors: int
    # How long reading device-timed figures may wait for the device (the engine's timeout).
    timeout_s: float = 300.0
    ready_samples: list[list[float]] = field(default_factory=list)
    # Per row of ready_samples, that iteration's before_first_ready_s (-1 where not measured).
    before_first_ready_rows: list[float] = field(default_factory=list)
    # One entry per recorded iteration with collectives: op -> its blocks' (bytes, seconds).
    collective_rounds: list[dict[str, list[tuple[int, float]]]] = field(default_factory=list)
    # Compute the simulator needs besides ready times, in seconds: "before_first_ready_s" (from
    # the end of the previous step() to the first ready gradient: forward, loss, start of
    # backward) and "step_s" (the optimizer's own update).
    compute_samples: dict[str, list[float]] = field(default_factory=dict)
    # (bytes, seconds) of single calls of the user's optimizer on a subset of the parameters:
    # the overlap runner's group updates, and the split update of the profiling steps.
    update_samples: list[tuple[int, float]] = field(default_factory=list)
    # Figure kind -> clock (Note [Which clock]); a kind appears once a figure of it was recorded.
    clocks: dict[str, str] = field(default_factory=dict)
    # (bytes, events, made_state) of optimizer calls timed on the device that it may not have
    # reached yet; read into update_samples (or first_update_samples) once it has (Note [Which
    # clock]).
    _pending_updates: list[tuple[int, EventSpan, bool]] = field(default_factory=list)
    # The calls that made the optimizer's state, apart (Note [A first call makes the optimizer's
    # state] in engine/step_clock.py): fitted only where update_samples lack two sizes.
    first_update_samples: list[tuple[int, float]] = field(default_factory=list)
    _kept_samples: int = 0  # over collective_rounds
    _restart: bool = False  # the next recorded iteration starts the window (restart_window)
    _restart_steady: bool = False  # ... and the window it starts is steady
    # Whether every iteration in the window ran the settled plan past its warm-up (Note
    # [Sampling the profile] in planning/lifecycle.py): then the whole window describes it,
    # otherwise its latest half.
    steady: bool = False
    # This iteration's before_first_ready_s, -1 until noted (Note [A pause is not compute]).
    _before_this_iteration: float = -1.0

    def _describing(self, values: list) -> list:
        """Of a window's figures, those that describe the plan running now."""
        return values if self.steady else latest_half(values)

    @property
    def samples_by_op(self) -> dict[str, list[tuple[int, float]]]:
        """Each op's blocks of a typical iteration, (bytes, median seconds), over the recorded
        iterations that describe the plan running now (`_describing`): what its fit is made
        from (Note [Fitting a collective's cost], Note [A collective's cost is its typical
        iteration's])."""
        per_op: dict[str, list[list[tuple[int, float]]]] = {}
        for round_ in self._describing(self.collective_rounds):
            for op, samples in round_.items():
                per_op.setdefault(op, []).append(samples)
        return {op: typical_blocks(rounds) for op, rounds in per_op.items()}

    @property
    def collective_samples(self) -> list[tuple[int, float]]:
        return self.samples_by_op.get("allreduce", [])

    def record(self, ready_us: Sequence[int], block_timings: Sequence[tuple[int, ...]],
               ops: Sequence[str] | None = None, clocks: dict[str, str] | None = None) -> None:
        """One iteration's figures from the engine; `clocks` ({"ready", "collective"} -> clock,
        the engine's last_clocks()) says where they came from (CPU when not given)."""
        if self._restart:
            self._start_window()
        before, self._before_this_iteration = self._before_this_iteration, -1.0
        marked = [t for t in ready_us if t >= 0]
        if marked:
            self.clocks["ready_time_s"] = (clocks or {}).get("ready", CPU)
            first = min(marked)
            self.ready_samples.append([(t - first) / 1e6 if t >= 0 else -1.0 for t in ready_us])
            _keep_last(self.ready_samples, KEEP_ITERATIONS)
            # This iteration's (Note [Every rank's gradients] in world_profile.py): its first
            # gradient came before the engine's wait for its blocks, in either mode.
            self.before_first_ready_rows.append(before)
            _keep_last(self.before_first_ready_rows, KEEP_ITERATIONS)
        round_: dict[str, list[tuple[int, float]]] = {}
        for position, (_block, nbytes, _ready, launch, done, service) in enumerate(block_timings):
            if launch >= 0 and done >= 0:
                self.clocks["collective_s"] = (clocks or {}).get("collective", CPU)
                op = ops[position] if ops else "allreduce"
                round_.setdefault(op, []).append((nbytes, service / 1e6))
        if round_:
            self._add_round(round_)

    def restart_window(self, steady: bool = False) -> None:
        """Makes the next recorded iteration the window's first: the iterations recorded so far
        ran other plans (`auto`'s trials, the profiling steps). They stay until then, so that
        a profile read before it is not empty. `steady`: the plan has settled, and every
        iteration from there on describes it."""
        self._restart = True
        self._restart_steady = steady

    def unsteady(self) -> None:
        """The plan changed: the window no longer describes one settled plan."""
        self.steady = self._restart_steady = False

    def no_compute_before(self) -> None:
        """This iteration's compute before its first gradient is not known (Note [A pause is
        not compute])."""
        self._before_this_iteration = -1.0

    def _start_window(self) -> None:
        self._restart = False
        self.steady = self._restart_steady
        self.ready_samples.clear()
        self.before_first_ready_rows.clear()
        self.collective_rounds.clear()
        self._kept_samples = 0
        for kind, values in self.compute_samples.items():
            # This iteration's compute before its first gradient was noted before record(),
            # unless it followed a pause.
            this_one = kind == "before_first_ready_s" and self._before_this_iteration >= 0
            del values[:-1 if this_one else None]

    def _add_round(self, round_: dict[str, list[tuple[int, float]]]) -> None:
        # A running count: summing every kept round again cost more than the rest of record().
        rounds = self.collective_rounds
        rounds.append(round_)
        self._kept_samples += _round_size(round_)
        while len(rounds) > 1 and (len(rounds) > KEEP_ITERATIONS
                                   or self._kept_samples > KEEP_COLLECTIVE_SAMPLES):
            self._kept_samples -= _round_size(rounds.pop(0))

    def note(self, kind: str, seconds: float) -> None:
        self.clocks["compute_s"] = CPU
        if kind == "before_first_ready_s":
            self._before_this_iteration = seconds
        values = self.compute_samples.setdefault(kind, [])
        values.append(seconds)
        _keep_last(values, KEEP_ITERATIONS)

    def note_update(self, nbytes: int, took: float | EventSpan, made_state: bool = False
                    ) -> None:
        """One optimizer call on `nbytes` of parameters: seconds on the CPU clock, or an event
        pair (UpdateTimer on CUDA), read once the device has passed its end; `made_state`: the
        call made the optimizer's state for some parameter (kept apart)."""
        if isinstance(took, EventSpan):
            self.clocks["update_s"] = DEVICE_EVENT
            self._pending_updates.append((nbytes, took, made_state))
            self._read_updates(wait=False)
        else:
            self.clocks["update_s"] = CPU
            self._add_update(nbytes, took, made_state)

    def _add_update(self, nbytes: int, seconds: float, made_state: bool) -> None:
        samples = self.first_update_samples if made_state else self.update_samples
        samples.append((nbytes, seconds))
        _keep_last(samples, KEEP_COLLECTIVE_SAMPLES)

    def _read_updates(self, wait: bool) -> None:
        """Moves the pending event pairs the device has passed (all of them when `wait`: then
        this waits, at most timeout_s, until the device reaches the last) into update_samples,
        in call order."""
        pending = self._pending_updates
        deadline = time.monotonic() + self.timeout_s
        pause = 1e-5  # growing sleeps, as Note [Waiting for device work] in the engine
        while pending:
            nbytes, span, made_state = pending[0]
            if not span.end.query():
                if not wait:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"commsched: timed out after {self.timeout_s:g} s (COMMSCHED_TIMEOUT) "
                        "waiting for the device to finish a timed optimizer call")
                time.sleep(pause)
                pause = min(2 * pause, 2.5e-4)
                continue
            pending.pop(0)
            self._add_update(nbytes, span.start.elapsed_time(span.end) / 1e3, made_state)

    def update_cost(self) -> NetModel | None:
        """One optimizer call's cost as fixed (alpha) + per byte (beta); None until calls of at
        least two sizes were timed (a plan with one group times one size only, so the window
        keeps the profiling steps' samples rather than only the latest half)."""
        self._read_updates(wait=True)
        samples = self.update_samples
        if len({n for n, _ in samples}) < 2:  # Note [A first call makes the optimizer's state]
            samples = samples + self.first_update_samples
        if len({n for n, _ in samples}) < 2:
            return None
        return fit_alpha_beta(samples)

    def compute(self) -> dict[str, float]:
        """Median of each compute sample over the iterations that describe the plan running
        now (see `profile`)."""
        return {kind: statistics.median(self._describing(values))
                for kind, values in self.compute_samples.items() if values}

    def iteration_rows(self) -> list[IterationRow]:
        """The sampled iterations that describe the plan running now, for the world's compute
        (world_profile.py)."""
        return self._describing([IterationRow(before, tuple(row)) for before, row
                                 in zip(self.before_first_ready_rows, self.ready_samples,
                                        strict=True)])

    @property
    def iterations(self) -> int:
        return len(self.ready_samples)

    def profile(self) -> Profile:
        """Median ready time per tensor over the latest half of the recorded iterations (the
        whole window once the plan has settled: `steady`): the first iterations are warm-up
        (allocations; a Transformer's backward took several times its steady time for about
        ten steps here: Note [Planning from the steady state] in lifecycle.py), and a re-plan
        late in a run should see the present."""
        rows = self._describing(self.ready_samples)
        if not rows:
            return Profile()
        times = []
        for tensor in range(self.num_tensors):
            seen = [row[tensor] for row in rows if row[tensor] >= 0]
            times.append(statistics.median(seen) if seen else 0.0)
        return Profile(tuple(times))

    def net_model(self, alpha: float | None = None, beta: float | None = None,
                  op: str = "allreduce") -> NetModel:
        fitted = fit_collective(self.samples_by_op.get(op, []))
        return NetModel(fitted.alpha if alpha is None else alpha,
                        fitted.beta if beta is None else beta)


PROFILE_SCHEMA_VERSION = 2


def _median_or_none(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def module_rows(module_order: Sequence[str], module_times: dict[str, list[float]]) -> list[dict]:
    """Inclusive forward time per module (the median over the latest half of its recorded
    forward passes, as for ready times: Note [Module times at steady state] in
    overlap/module_profile.py), and its own time: inclusive minus its children's."""
    inclusive = {name: _median_or_none(latest_half(module_times.get(name) or []))
                 for name in module_order}
    children = children_seconds(inclusive)
    rows = []
    for i, name in enumerate(module_order):
        own = inclusive[name]
        self_time = None if own is None else max(own - children.get(name, 0.0), 0.0)
        rows.append({"name": name, "forward_order": i, "forward_time_s": own,
                     "self_time_s": self_time})
    return rows


def profile_document(specs: Sequence[TensorSpec], profiler: Profiler, world_size: int,
                     module_order: Sequence[str], module_times: dict[str, list[float]],
                     first_users: dict[int, str] | None = None, update_shards: int = 1
                     ) -> dict:
    """The JSON written to COMMSCHED_PROFILE; the schema is documented in docs/profile.md.
    `update_shards`: the ranks each update was divided among (shard_optimizer) in the window
    it describes."""
    profile = profiler.profile()
    users = first_users or {}
    tensors = [{"id": s.tensor_id, "name": s.name, "numel": s.numel, "dtype": s.dtype,
                "bytes": s.nbytes, "forward_index": s.forward_index,
                "ready_time_s": profile.ready_times[s.tensor_id] if profile.measured else None,
                "module": users.get(s.tensor_id)}
               for s in specs]
    modules = module_rows(module_order, module_times)
    collectives = {}
    for op, samples in sorted(profiler.samples_by_op.items()):
        net = fit_collective(samples)
        collectives[op] = {"alpha_s": net.alpha, "beta_s_per_byte": net.beta,
                           "clock": profiler.clocks.get("collective_s", CPU),
                           "samples": [[n, t] for n, t in samples]}
    compute = profiler.compute()
    update = profiler.update_cost()
    if update is not None:
        compute.update({"update_fixed_s": update.alpha, "update_per_byte_s": update.beta})
    shards = {"update_shards": update_shards} if update_shards > 1 else {}
    return {"schema_version": PROFILE_SCHEMA_VERSION, "world_size": world_size, **shards,
            "iterations": profiler.iterations, "compute": compute, "tensors": tensors,
            "modules": modules, "collectives": collectives,
            "clocks": {**profiler.clocks, **({"module_forward_s": CPU} if modules else {})}}
