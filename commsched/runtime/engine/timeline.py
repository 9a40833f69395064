"""Chrome-trace (Perfetto) timeline, one JSON file per rank.

Events are appended as they are drained from the engine; the array is closed on shutdown (the
trace format allows a missing closing bracket, so a crashed run still loads). Every span and
instant says in args.clock which clock it came from: "cpu" (the steady clock of the host), or
"device_event" for an engine span of device tensors, read from events on the streams (Note
[Device time] in csrc/device_clock.cpp).
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

from ... import _C
from ...outputs import prepare_file

LANES = {0: "compute (gradient ready)", 1: "engine: pack + launch",
         2: "completion: collective + unpack", 3: "training thread: waits and updates"}


def timeline_path(template: str, rank: int) -> str:
    if "{rank}" in template:
        return template.format(rank=rank)
    stem, ext = os.path.splitext(template)
    return f"{stem}.rank{rank}{ext or '.json'}"


class TimelineWriter:
    def __init__(self, template: str, rank: int) -> None:
        self.path = prepare_file(timeline_path(template, rank), "COMMSCHED_TIMELINE")
        self._rank = rank
        self._origin_us = _C.now_us()
        self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._first = True
        self._file.write("[\n")
        self._emit({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}})
        for lane, name in LANES.items():
            self._emit({"name": "thread_name", "ph": "M", "pid": rank, "tid": lane,
                        "args": {"name": name}})

    def _emit(self, event: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(("" if self._first else ",\n") + json.dumps(event))
        self._first = False

    def engine_events(self, events: list[tuple]) -> None:
        for name, phase, ts, dur, lane, block, nbytes, op, clock in events:
            event: dict[str, Any] = {"name": name, "ph": phase, "ts": ts - self._origin_us,
                                     "pid": self._rank, "tid": lane}
            if phase == "X":
                event["dur"] = dur
                event["args"] = {"block": block, "bytes": nbytes, "op": op, "clock": clock}
            else:
                event["s"] = "t"
                event["args"] = {"clock": clock}
            self._emit(event)
        if self._file is not None:
            self._file.flush()

    def span(self, name: str, lane: int, start_us: int, end_us: int, **args: Any) -> None:
        self._emit({"name": name, "ph": "X", "ts": start_us - self._origin_us,
                    "dur": end_us - start_us, "pid": self._rank, "tid": lane,
                    "args": {**args, "clock": "cpu"}})

    def mark(self, name: str) -> None:
        self._emit({"name": name, "ph": "i", "s": "p", "ts": _C.now_us() - self._origin_us,
                    "pid": self._rank, "tid": 0, "args": {"clock": "cpu"}})

    def close(self) -> None:
        if self._file is not None:
            self._file.write("\n]\n")
            self._file.close()
            self._file = None
