"""Heartbeats and the stall inspector, through the rendezvous store.

Every rank runs one daemon thread that, each `INTERVAL` seconds, publishes a small state under
``commsched/state/<rank>``: a heartbeat counter and, per engine, its iteration, how long the
training thread has been waiting on it, and which gradients it has not produced yet.

* A failed or timed-out wait asks `silent_ranks()` which peers stopped beating, so that the
  error names the rank that died or hangs instead of only a socket error.
* Rank 0's thread is the stall inspector (as Horovod's coordinator is): when some rank has
  waited longer than COMMSCHED_STALL_WARNING seconds, it warns, per rank, which gradients are
  ready on some ranks and missing on that one. Nothing else happens: the job goes on when the
  late rank catches up.

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
from typing import Any

import torch.distributed as dist

log = logging.getLogger("commsched")

INTERVAL = 1.0
STORE_TIMEOUT = 5.0
PREFIX = "commsched/state/"
SHOWN = 8  # tensor names listed per rank in a warning


class StallWarning(UserWarning):
    pass


class Liveness:
    def __init__(self, host: str, port: int, rank: int, size: int, stall_warning: float,
                 engines: Callable[[], list[Any]]) -> None:
        self.rank, self.size, self.stall_warning = rank, size, stall_warning
        self._engines = engines
        self._store = dist.TCPStore(host, port, size, is_master=False,
                                    timeout=datetime.timedelta(seconds=STORE_TIMEOUT))
        self._beat = 0
        self._warned: set[tuple] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one store client, two threads (beats and error path)
        self._thread = threading.Thread(target=self._loop, name="commsched-liveness", daemon=True)
        self._thread.start()

    # -- publishing -------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        engines = {}
        for engine in self._engines():
            engines[str(engine.engine_id)] = engine.progress()
        return {"beat": self._beat, "engines": engines, "left": False}

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._beat += 1
            try:
                with self._lock:
                    self._store.set(PREFIX + str(self.rank), json.dumps(self._state()))
                if self.rank == 0 and self.stall_warning > 0:
                    self._inspect()
            except Exception as err:  # a gone store must not kill training
                log.debug("commsched liveness: %s", err)

    def _read_all(self) -> dict[int, dict | None]:
        keys = [PREFIX + str(r) for r in range(self.size)]
        with self._lock:
            present = [self._store.check([key]) for key in keys]
            values = [self._store.get(key) if ok else None
                      for key, ok in zip(keys, present, strict=True)]
        return {r: json.loads(v) if v is not None else None for r, v in enumerate(values)}

    # -- failure diagnosis --------------------------------------------------------------------

    def silent_ranks(self, window: float = 2.5 * INTERVAL) -> tuple[list[int], str]:
        """Ranks whose heartbeat did not move within `window` seconds (or that left), and a
        sentence saying so; the store being unreachable is reported as such."""
        try:
            before = self._read_all()
            time.sleep(window)
            after = self._read_all()
        except Exception as err:
            return [], (f"the rendezvous store is unreachable ({type(err).__name__}); the rank or "
                        "launcher hosting it (rank 0 under horovodrun) may be gone")
        silent = [r for r in range(self.size) if r != self.rank and _silent(before[r], after[r])]
        if not silent:
            return [], "every peer still sends heartbeats"
        names = ", ".join(str(r) for r in silent)
        return silent, f"rank{'s' if len(silent) > 1 else ''} {names} stopped responding " \
                       f"(no heartbeat for {window:.1f} s)"

    # -- stall inspector (rank 0) ---------------------------------------------------------------

    def _inspect(self) -> None:
        states = self._read_all()
        by_engine: dict[str, dict[int, dict]] = {}
        for rank, state in states.items():
            for engine_id, progress in (state or {}).get("engines", {}).items():
                by_engine.setdefault(engine_id, {})[rank] = progress
        for engine_id, per_rank in by_engine.items():
            waited = max((p.get("waiting_s") or 0.0) for p in per_rank.values())
            if waited < self.stall_warning:
                continue
            message = stall_message(engine_id, per_rank, waited)
            key = (engine_id, message)
            if message and key not in self._warned:
                self._warned.add(key)
                warnings.warn(message, StallWarning, stacklevel=1)
                log.warning(message)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=STORE_TIMEOUT + INTERVAL)
        try:
            with self._lock:
                self._store.set(PREFIX + str(self.rank),
                                json.dumps({"beat": -1, "engines": {}, "left": True}))
        except Exception:  # best effort on the way out
            pass


def _silent(before: dict | None, after: dict | None) -> bool:
    return after is None or bool(after.get("left")) or before == after


def stall_message(engine_id: str, per_rank: dict[int, dict], waited: float) -> str:
    """Per rank: the gradients ready on some ranks and missing on it (Horovod's stall report)."""
    iterations = {r: p.get("iteration", 0) for r, p in per_rank.items()}
    newest = max(iterations.values())
    missing: dict[int, list[str]] = {}
    for rank, progress in per_rank.items():
        if iterations[rank] < newest:
            missing[rank] = [f"(still in iteration {iterations[rank]}, others in {newest})"]
            continue
        mine = set(progress["not_ready"])
        ready_elsewhere = set().union(*(mine - set(p["not_ready"]) for r, p in per_rank.items()
                                        if r != rank and iterations[r] == newest))
        if ready_elsewhere:
            missing[rank] = sorted(ready_elsewhere)
    if not missing:
        return ""
    lines = [f"commsched stall (engine {engine_id}): ranks waited {waited:.0f} s "
             "(COMMSCHED_STALL_WARNING); gradients ready on some ranks and missing on others:"]
    for rank, names in sorted(missing.items()):
        shown = ", ".join(f"'{n}'" if not n.startswith("(") else n for n in names[:SHOWN])
        more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
        lines.append(f"  rank {rank}: missing {shown}{more}")
    return "\n".join(lines)
