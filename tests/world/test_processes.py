"""Whether a rank's process is gone (world/processes.py, Note [Telling an exit from a hang]):
real processes of this machine, exited, exited and not reaped, and running."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from commsched.world import processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _wait_until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_running_process_is_not_gone_and_a_reaped_one_is() -> None:
    child = _child()
    state = {**processes.identity(), "pid": child.pid}
    try:
        assert not processes.gone(state)
        assert not processes.gone(processes.identity())  # this process
    finally:
        child.kill()
        child.wait(timeout=10)
    assert processes.gone(state)


def test_an_exited_process_its_launcher_has_not_reaped_is_gone() -> None:
    child = _child()
    state = {**processes.identity(), "pid": child.pid}
    child.kill()  # not waited for: a zombie until wait() below
    try:
        assert _wait_until(lambda: processes.gone(state))
    finally:
        child.wait(timeout=10)


@pytest.mark.parametrize("field, value", [("boot_id", "another-machine-or-boot"),
                                          ("pid_ns", "pid:[1]"), ("boot_id", None),
                                          ("pid", None)])
def test_nothing_is_claimed_of_another_machine_or_pid_namespace(field: str,
                                                               value: object) -> None:
    child = _child()
    child.kill()
    child.wait(timeout=10)
    state = {**processes.identity(), "pid": child.pid, field: value}
    assert not processes.gone(state)  # gone, but not where this process could tell


def _proc_entry_raises(monkeypatch: pytest.MonkeyPatch, pid: int, error: type[OSError]) -> None:
    """Reading /proc/<pid>/stat raises `error`; every other file opens as it would."""
    real_open = open

    def opened(path: str, *args: object, **kwargs: object) -> object:
        if path == f"/proc/{pid}/stat":
            raise error(path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", opened)


def test_a_missing_proc_entry_is_confirmed_by_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc mounted with hidepid shows no entry for another user's live process: kill(pid, 0)
    # then says it exists (EPERM), and nothing is claimed.
    state = processes.identity()
    _proc_entry_raises(monkeypatch, state["pid"], FileNotFoundError)
    assert not processes.gone(state)  # this very process: alive
    monkeypatch.setattr(processes.os, "kill", _raise(PermissionError()))
    assert not processes.gone(state)
    monkeypatch.setattr(processes.os, "kill", _raise(ProcessLookupError()))
    assert processes.gone(state)


def test_an_unreadable_proc_entry_claims_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    state = processes.identity()
    _proc_entry_raises(monkeypatch, state["pid"], PermissionError)
    assert not processes.gone(state)


def _raise(error: OSError) -> Callable[[int, int], None]:
    def kill(pid: int, signal: int) -> None:
        raise error
    return kill
