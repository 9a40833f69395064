"""Heartbeats, the failure diagnosis and the stall inspector, through the rendezvous store.

Every rank runs one daemon thread that, each `INTERVAL` seconds, publishes a small state under
``commsched/state/<rank>``: a heartbeat counter, the phase its training thread is in (forward,
backward, step, or a collective outside the engines; `registry.activity`, set by the session)
and since when, and, per engine, its iteration, its round of waits, how long the training thread
has been waiting on it, and which tensors it has not been handed yet.

* A failed or timed-out wait asks `diagnose()`, which watches the heartbeats for `WINDOW`
  seconds and classifies every other rank (`classify`): silent (its heartbeat stopped), left
  (it shut commsched down), or alive but stuck: behind in iteration, holding back gradients that
  other ranks handed over, or busy outside any collective while the others wait; each with its
  phase and for how long. The error then starts with the culprits.
* Rank 0's thread is the stall inspector (as Horovod's coordinator is): when some rank has
  waited longer than COMMSCHED_STALL_WARNING seconds, it warns with the same classification
  (per rank, the gradients ready on some ranks and missing on it, or where it is stuck).
  Nothing else happens: the job goes on when the late rank catches up.

The thread talks to the store through its own client with a short timeout, so a dead store
host cannot block it for the whole COMMSCHED_TIMEOUT.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from . import processes, registry

log = logging.getLogger("commsched")

INTERVAL = 1.0
STORE_TIMEOUT = 5.0
WINDOW = 2.5 * INTERVAL  # how long a failed wait watches the heartbeats before it names anyone
PREFIX = "commsched/state/"
SHOWN = 8  # tensor names listed per rank
GRADIENTS = "gradients"  # the label of a wrapped optimizer's engine (EngineHandle.label)


class StallWarning(UserWarning):
    """Rank 0's warning that a rank has waited COMMSCHED_STALL_WARNING seconds for the others.

    Horovod's stall inspector gives the same kind of warning. It names the late ranks and how
    they are late (the gradients ready on some ranks and missing on them, or the phase they are
    stuck in and for how long), once per stall; training goes on if they catch up, and the
    error (RankFailureError) follows only at COMMSCHED_TIMEOUT. By default the warning comes at
    a fifth of the timeout; 0 disables it. It also goes to the ``commsched`` logger where
    logging is set up. Filter or escalate it with the ``warnings`` module.
    """


@dataclass(frozen=True)
class Culprit:
    """One rank that holds the others up, and how."""

    rank: int
    kind: str  # "silent", "exited", "left" or "stuck"
    text: str  # a sentence for the error: "rank 1 is stuck in forward of iteration 4 for ..."
    line: str  # the stall warning's line: "rank 1: missing '0.weight'; stuck in backward ..."
    key: tuple  # what it is without the times, so that a stall is warned about once


@dataclass(frozen=True)
class Diagnosis:
    culprits: tuple[Culprit, ...]
    text: str  # starts with the culprits; says so when there is none

    @property
    def ranks(self) -> list[int]:
        return [c.rank for c in self.culprits]


class Liveness:
    def __init__(self, host: str, port: int, rank: int, size: int, stall_warning: float,
                 engines: Callable[[], list[Any]], namespace: str = "") -> None:
        self.rank, self.size, self.stall_warning = rank, size, stall_warning
        self._prefix = namespace + PREFIX  # a restarted torchrun job's attempt has its own
        self._engines = engines
        self._store = dist.TCPStore(host, port, size, is_master=False,
                                    timeout=datetime.timedelta(seconds=STORE_TIMEOUT))
        self._beat = 0
        self._identity = processes.identity()  # Note [Telling an exit from a hang]
        self._warned: set[tuple] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one store client, two threads (beats and error path)
        self._thread = threading.Thread(target=self._loop, name="commsched-liveness", daemon=True)
        self._thread.start()

    # -- publishing -------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        engines = {}
        for engine in self._engines():
            if engine.has_peers:
                engines[str(engine.engine_id)] = engine.progress()
        state: dict[str, Any] = {"beat": self._beat, "engines": engines, "left": False,
                                 **self._identity}
        now = registry.activity.now
        if now is not None:
            phase, since, iteration = now
            state.update(phase=phase, phase_s=round(time.monotonic() - since, 3),
                         phase_iteration=iteration)
        return state

    def _loop(self) -> None:
        # The first beat at once: a rank that fails within its first interval is then reported
        # as silent since that beat (or as left), not as one that never sent a heartbeat.
        while True:
            self._beat += 1
            try:
                state = json.dumps(self._state())
                with self._lock:
                    self._store.set(self._prefix + str(self.rank), state)
                if self.rank == 0 and self.stall_warning > 0:
                    self._inspect()
            except Exception as err:  # a gone store must not kill training
                log.debug("commsched liveness: %s", err)
            if self._stop.wait(INTERVAL):
                return

    def _read_all(self) -> dict[int, dict | None]:
        keys = [self._prefix + str(r) for r in range(self.size)]
        # Bounded: the beating thread may hold the client in a set() to a store that is gone.
        if not self._lock.acquire(timeout=STORE_TIMEOUT):
            raise TimeoutError("the store client stayed busy")
        try:
            present = [self._store.check([key]) for key in keys]
            values = [self._store.get(key) if ok else None
                      for key, ok in zip(keys, present, strict=True)]
        finally:
            self._lock.release()
        return {r: json.loads(v) if v is not None else None for r, v in enumerate(values)}

    # -- failure diagnosis --------------------------------------------------------------------

    def diagnose(self, window: float = WINDOW,
                 ranks: tuple[int, ...] | None = None) -> Diagnosis:
        """Which ranks hold this one up and how, from the heartbeats of `window` seconds (bounded
        by about window + 3 store timeouts when the store is gone); the store being unreachable
        is reported as such. `ranks`: a process set's members, the only ranks that can hold up
        its collectives (None: every rank)."""
        try:
            before = self._read_all()
            time.sleep(window)
            after = self._read_all()
        except Exception as err:
            return Diagnosis((), f"the rendezvous store is unreachable ({type(err).__name__}); the "
                                 "rank or launcher hosting it (rank 0 under horovodrun) may be "
                                 "gone")
        after[self.rank] = self._state()  # this rank as it is now, not as last published
        if ranks is not None:
            after = {r: s for r, s in after.items() if r in ranks}
        return classify(after, me=self.rank, before=before, window=window,
                        exited=processes.gone)

    # -- stall inspector (rank 0) ---------------------------------------------------------------

    def _inspect(self) -> None:
        states = self._read_all()
        states[self.rank] = self._state()
        waits = [_view(r, s).waiting_s for r, s in states.items() if s is not None]
        waited = max((w for w in waits if w is not None), default=0.0)
        if waited < self.stall_warning:
            return
        # A rank counts once it has been where it is for a good part of the wait: one that is
        # merely a little behind on a slow network is not named.
        diagnosis = classify(states, min_seconds=self.stall_warning / 2)
        if not diagnosis.culprits or all(c.key in self._warned for c in diagnosis.culprits):
            return
        self._warned.update(c.key for c in diagnosis.culprits)
        message = "\n".join(
            [f"commsched stall: a rank has waited {waited:.0f} s (COMMSCHED_STALL_WARNING="
             f"{self.stall_warning:g}); the ranks holding it up:"]
            + [f"  {c.line}" for c in diagnosis.culprits])
        # Note [One stall warning on the screen]
        # This thread has no caller to point at, so the warning names commsched rather than this
        # line's source (warn() would print it). The log gets its copy only where logging is set up,
        # since otherwise Python's last-resort handler prints the same text to stderr a second time;
        # where logging is set up, the log's copy is the program's choice (it may print beside the
        # warning), unless logging captures warnings, which already puts this one in the log.
        warnings.warn_explicit(message, StallWarning, "commsched", 0)
        captured = getattr(warnings.showwarning, "__module__", "") == "logging"
        if log.hasHandlers() and not captured:
            log.warning(message)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=STORE_TIMEOUT + INTERVAL)
        try:
            with self._lock:
                self._store.set(self._prefix + str(self.rank),
                                json.dumps({"beat": -1, "engines": {}, "left": True}))
        except Exception:  # best effort on the way out
            pass


# -- classification (pure: states in, verdict out) --------------------------------------------


@dataclass(frozen=True)
class _View:
    """One rank's published state, read."""

    rank: int
    engines: dict[str, dict]
    phase: str | None
    phase_s: float
    phase_iteration: int | None
    waiting_s: float | None  # its longest wait in progress (an engine's, or a collective phase)


def _view(rank: int, state: dict) -> _View:
    engines = state.get("engines") or {}
    phase, phase_s = state.get("phase"), float(state.get("phase_s") or 0.0)
    waits = [float(p["waiting_s"]) for p in engines.values() if p.get("waiting_s") is not None]
    if phase == "collective":
        waits.append(phase_s)
    return _View(rank, engines, phase, phase_s, state.get("phase_iteration"),
                 max(waits) if waits else None)


def _names(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} " + ", ".join(str(r) for r in sorted(ranks))


def _ended(rank: int, state: dict) -> Culprit:
    """A silent rank whose process is gone (Note [Telling an exit from a hang])."""
    return Culprit(rank, "exited", f"rank {rank}'s process (pid {state.get('pid')} on "
                   f"{state.get('host')}) has ended without calling commsched.shutdown(): it "
                   "crashed, was killed (out of memory, say) or returned early; see its output "
                   "and its exit code in the launcher's log", f"rank {rank}: its process ended",
                   (rank, "exited"))


def classify(states: dict[int, dict | None], me: int | None = None,
             before: dict[int, dict | None] | None = None, window: float = WINDOW,
             min_seconds: float = 0.0,
             exited: Callable[[dict], bool] = lambda state: False) -> Diagnosis:
    """The ranks that hold the others up. `states`: every rank's heartbeat state (None: never
    published); `me`: the rank asking, which is waiting (never a culprit); `before`: the states
    `window` seconds earlier, to tell a silent rank (same state) from a live one; `min_seconds`:
    a live rank is named only once it has been where it is that long; `exited`: whether a
    silent rank's process is known to be gone (Note [Telling an exit from a hang] in
    processes.py)."""
    culprits: list[Culprit] = []
    views: dict[int, _View] = {}
    for rank in sorted(states):
        state = states[rank]
        if rank == me:
            views[rank] = _view(rank, state or {})
        elif state is None:
            culprits.append(Culprit(rank, "silent", f"rank {rank} stopped responding (it never "
                                    "sent a heartbeat)", f"rank {rank}: no heartbeat yet",
                                    (rank, "silent")))
        elif state.get("left"):
            culprits.append(Culprit(rank, "left", f"rank {rank} left (it shut commsched down: it "
                                    "finished, or failed itself)", f"rank {rank}: left",
                                    (rank, "left")))
        elif before is not None and before.get(rank) == state:
            culprits.append(_ended(rank, state) if exited(state) else Culprit(
                rank, "silent", f"rank {rank} stopped responding (no heartbeat for {window:.1f} s)",
                f"rank {rank}: stopped responding", (rank, "silent")))
        else:
            views[rank] = _view(rank, state)
    newest: dict[str, int] = {}
    for view in views.values():
        for engine_id, progress in view.engines.items():
            newest[engine_id] = max(newest.get(engine_id, progress["iteration"]),
                                    progress["iteration"])
    stuck = [(view, _stuck(view, views, newest, me, min_seconds)) for view in views.values()
             if view.rank != me]
    # A rank waiting in a collective waits for someone: it is named only when no rank outside
    # a collective is (with 3 ranks and an overlap policy a waiting rank may be an iteration
    # behind the first one and still be a victim of the third).
    named = [c for v, c in stuck if c is not None and v.waiting_s is None] or \
        [c for _, c in stuck if c is not None]
    culprits += named
    if culprits:
        return Diagnosis(tuple(culprits), "; ".join(c.text for c in culprits))
    waiting = [f"rank {v.rank} {_where(v, '')}" for v in views.values() if v.rank != me]
    return Diagnosis((), "no peer is behind or silent: every peer still sends heartbeats and "
                         "waits in a collective too" + (f" ({'; '.join(waiting)})"
                                                        if waiting else ""))


def _missing(view: _View, views: dict[int, _View], label: str | None
             ) -> tuple[list[str], list[int], bool]:
    """Tensors `view`'s rank has not handed over on its engines labelled `label` (any label when
    None): those another rank in the same round of waits has handed over, with those ranks, when
    some rank is in that round (comparable); else every tensor it has not handed over."""
    names: list[str] = []
    holders: set[int] = set()
    comparable = False
    for engine_id, progress in view.engines.items():
        if label is not None and progress.get("label", GRADIENTS) != label:
            continue
        peers = [v for v in views.values() if v.rank != view.rank and engine_id in v.engines
                 and v.engines[engine_id].get("round") == progress.get("round")]
        if not peers:
            names += [n for n in progress["not_ready"] if n not in names]
            continue
        comparable = True
        for name in progress["not_ready"]:
            having = [v.rank for v in peers if name not in v.engines[engine_id]["not_ready"]]
            if having and name not in names:
                names.append(name)
                holders.update(having)
    return names, sorted(holders), comparable


def _stuck(view: _View, views: dict[int, _View], newest: dict[str, int], me: int | None,
           min_seconds: float) -> Culprit | None:
    behind = {e: (p["iteration"], newest[e]) for e, p in view.engines.items()
              if p["iteration"] < newest[e]}
    missing, _, comparable = _missing(view, views, None)
    held_back = comparable and bool(missing)
    others_wait = any(v.rank == me or v.waiting_s is not None
                      for v in views.values() if v.rank != view.rank)
    busy = view.waiting_s is None and others_wait
    if not (behind or held_back or busy):
        return None
    seconds = view.waiting_s if view.waiting_s is not None else view.phase_s
    if view.phase is not None and seconds < min_seconds:
        return None
    # Behind on a wrapped optimizer's engine reads as iterations; on another engine (K-FAC's)
    # as its rounds.
    grad_behind = [n for e, (_, n) in behind.items()
                   if view.engines[e].get("label", GRADIENTS) == GRADIENTS]
    if grad_behind:
        others = f" (the others are in {max(grad_behind)})"
    elif behind:
        e, (mine, theirs) = next(iter(behind.items()))
        label = view.engines[e].get("label", "engine " + e)
        others = f" (its {label} are at round {mine}, the others' at {theirs})"
    else:
        others = ""
    names: list[str] = []
    holders: list[int] = []
    if view.waiting_s is None and view.phase in ("backward", None):
        names, holders, comparable = _missing(view, views, GRADIENTS if view.phase else None)
        if not comparable:
            holders = []
    where = _where(view, others, bool(names))
    handed = f"it has not handed over {_names(names)}" + (
        f" (handed over on {_ranks(holders)})" if holders else "")
    text = f"rank {view.rank} is {where}" + (f": {handed}" if names else "")
    line = f"rank {view.rank}: " + (f"missing {_names(names)}; " if names else "") + where
    key = (view.rank, "stuck", view.phase, view.phase_iteration, view.waiting_s is None,
           tuple(names), tuple(sorted(view.engines)), tuple(sorted(behind)))
    return Culprit(view.rank, "stuck", text, line, key)


def _where(view: _View, others: str, missing: bool = False) -> str:
    """Where the rank is, for how long: "stuck in forward of iteration 4 (...) for 6.2 s"."""
    iteration = view.phase_iteration
    if iteration is None:
        iterations = [p["iteration"] for p in view.engines.values()]
        iteration = min(iterations) if iterations else None
    of = f" of iteration {iteration}" if iteration is not None else ""
    if view.waiting_s is not None:
        during = {"forward": " in forward", "backward": " in backward", "step": " in step()"}
        return (f"waiting in a collective{during.get(view.phase or '', '')}{of}{others} for "
                f"{view.waiting_s:.1f} s")
    seconds = f" for {view.phase_s:.1f} s"
    if view.phase == "backward" and missing:
        return f"stuck in backward{of}{others}{seconds}"
    if view.phase == "backward":
        return (f"stuck after backward, before step(), in iteration {iteration}{others}{seconds} "
                "(it handed over every gradient and has not called step())")
    if view.phase == "step":
        return (f"stuck in step(){of}{others}{seconds} (in synchronize() or the optimizer's step, "
                "outside any collective)")
    if view.phase == "forward":
        return f"stuck in forward{of}{others}{seconds} (after step(), before its first gradient)"
    return f"stuck{of}{others}, outside any collective"
