"""Whether a rank's process is gone, where this process can tell: a rank that exited without
shutting commsched down (a crash, `os._exit`, a kill) is then reported as exited rather than as
one that stopped responding (Note [Telling an exit from a hang]).

Note [Telling an exit from a hang]
A rank whose heartbeat stopped either exited or hangs with its heartbeat thread stuck (a process
stopped by a debugger, a machine gone). Which one matters to the user: an exit is a crash to
look for in that rank's output, a hang is a process to inspect. Each rank publishes its process
id, host name and PID namespace with its heartbeats; a rank on the same host and in the same PID
namespace can then look the process up. A zombie (exited, not yet reaped by its launcher) is
gone. A host name alone would not do: containers with the host's network share its name but
not its process ids. Anywhere else, or where /proc cannot be read, nothing is claimed.
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


def identity() -> dict[str, Any]:
    """This process, as published with its heartbeats."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_ns": _pid_namespace()}


def gone(state: dict[str, Any]) -> bool:
    """Whether the process `state` (a published heartbeat) came from has certainly exited."""
    pid, namespace = state.get("pid"), state.get("pid_ns")
    if not isinstance(pid, int) or namespace is None or namespace != _pid_namespace() \
            or state.get("host") != socket.gethostname():
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return bool(fields) and fields[0] in ("Z", "X")  # exited, not yet reaped (or being)
