"""Whether a rank's process is gone, where this process can tell: a rank that exited without
shutting commsched down (a crash, `os._exit`, a kill) is then reported as exited rather than as
one that stopped responding (Note [Telling an exit from a hang]).

Note [Telling an exit from a hang]
A rank whose heartbeat stopped either exited or hangs with its heartbeat thread stuck (a process
stopped by a debugger, a machine gone). Which one matters to the user: an exit is a crash, a
kill or an early return to look for in that rank's output and exit code, a hang is a process to
inspect. Each rank publishes its process id, its machine's boot id and its PID namespace with
its heartbeats; a rank on the same machine and in the same PID namespace can then look the
process up. A zombie (exited, not yet reaped by its launcher) is gone. Neither a host name nor a
namespace id tells machines apart (cloned machines share names, and every machine's first PID
namespace has the same id): the boot id, random per machine and boot, does. Where /proc hides
other users' processes (hidepid), a missing /proc entry is confirmed by kill(pid, 0). Anywhere
else, or where /proc cannot be read, nothing is claimed.
"""

from __future__ import annotations

import os
import socket
from typing import Any


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def identity() -> dict[str, Any]:
    """This process, as published with its heartbeats."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id(),
            "pid_ns": _pid_namespace()}


def _no_such_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, as another user's
        return False
    return False


def gone(state: dict[str, Any]) -> bool:
    """Whether the process `state` (a published heartbeat) came from has certainly exited."""
    pid, boot, namespace = state.get("pid"), state.get("boot_id"), state.get("pid_ns")
    if not isinstance(pid, int) or boot is None or namespace is None \
            or boot != _boot_id() or namespace != _pid_namespace():
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return _no_such_process(pid)
    except OSError:
        return False
    return bool(fields) and fields[0] in ("Z", "X")  # exited, not yet reaped (or being)
