"""The engines alive in this process, as the world sees them, and what holds updates deferred
to the next forward pass.

Engines register here when they are made, so that the heartbeat thread can publish their
progress and ``commsched.shutdown()`` can stop them, without the world importing the runtime
that sits above it (an engine needs a world to exist; the world only needs this protocol).
Overlap runners register too: shutdown() applies what they hold first (Note [The last deferred
update] in runtime/modes/overlap/runner.py).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Protocol


class Participant(Protocol):
    """What the world needs of an engine: an id equal on every rank that runs it (a process
    set's engines carry the set in theirs), its progress for the heartbeats, and a way to stop
    it."""

    engine_id: str
    has_peers: bool  # False in a world of one: nothing to publish

    def progress(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


class Activity:
    """What this process's training thread is doing, for the heartbeats: `now` is (phase, since,
    iteration), set by the session with one assignment when the phase changes (at the first
    gradient: "backward"; in synchronize()/step(): "step"; when step() returns: "forward";
    in a wait outside the engines: "collective"), read by the heartbeat thread. `since` is
    time.monotonic(); None before any session ran."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now: tuple[str, float, int] | None = None


activity = Activity()

_live: weakref.WeakSet[Any] = weakref.WeakSet()


def register(participant: Participant) -> None:
    _live.add(participant)


def unregister(participant: Participant) -> None:
    _live.discard(participant)


def participants() -> list[Participant]:
    return sorted(_live, key=lambda p: (len(p.engine_id), p.engine_id))


class Deferring(Protocol):
    """What holds updates deferred to the next forward pass (an overlap plan's runner)."""

    def finish(self) -> None: ...


_deferring: weakref.WeakSet[Any] = weakref.WeakSet()


def register_deferring(holder: Deferring) -> None:
    _deferring.add(holder)


def unregister_deferring(holder: Deferring) -> None:
    _deferring.discard(holder)


def apply_deferred() -> None:
    """Applies every update still deferred; one that cannot be (a peer gone, the world broken)
    is dropped with a warning naming why, and shutdown goes on."""
    for holder in list(_deferring):
        try:
            holder.finish()
        except Exception as err:  # shutdown goes on: the warning says what was lost and why
            warnings.warn(f"commsched.shutdown(): an update deferred to the next forward pass "
                          f"was not applied: {err}", RuntimeWarning, stacklevel=3)


def shutdown_all() -> None:
    for participant in participants():
        participant.shutdown()
