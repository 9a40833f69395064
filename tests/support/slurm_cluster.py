"""A one-node Slurm cluster for the tests, started and stopped by them: munged with a key of its
own, slurmctld and slurmd from Debian's slurm-wlm packages, this host as the only node
(`auth/munge`, `proctrack/linuxproc`, `select/linear`), every file under one temporary folder
and free ports, so that nothing of the machine's own configuration is read or changed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scancel")


def missing_parts() -> str | None:
    """Why a Slurm cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "needs root to run slurmd and munged"
    absent = [name for name in DAEMONS if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed (scripts/setup.sh installs them as root)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(root: str, host: str) -> str:
    ctld, slurmd = _free_port(), _free_port()
    return "\n".join([
        "ClusterName=commschedtest", f"SlurmctldHost={host}",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        "ProctrackType=proctrack/linuxproc", "SelectType=select/linear", "TaskPlugin=task/none",
        "SlurmUser=root", "SlurmdUser=root", "MpiDefault=none", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
        f"NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE", ""])


def _stop(pid_files: list[str]) -> None:
    """SIGTERM to every daemon at once, then up to 5 s for each to end before SIGKILL: slurmd,
    slurmctld and munged each take a while to shut down, and need not take it in turn."""
    pids = []
    for pid_file in pid_files:
        try:
            with open(pid_file, encoding="utf-8") as handle:
                pid = int(handle.read().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):  # never started, or already gone
            continue
        pids.append(pid)
    deadline = time.monotonic() + 5.0
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextmanager
def slurm_cluster(root: str) -> Iterator[dict[str, str]]:
    """Starts the cluster under `root`; yields the environment its commands need (SLURM_CONF);
    stops every daemon on exit, also when starting failed."""
    host = socket.gethostname().split(".")[0]
    for folder in ("state", "spool"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    key = os.path.join(root, "munge.key")
    with open(key, "wb") as handle:
        handle.write(os.urandom(1024))
    os.chmod(key, 0o600)
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w", encoding="utf-8") as handle:
        handle.write(_config(root, host))
    env = {**os.environ, "SLURM_CONF": conf}
    pid_files = [os.path.join(root, name) for name in ("slurmd.pid", "slurmctld.pid",
                                                       "munged.pid")]
    try:
        subprocess.run(["munged", f"--socket={root}/munge.socket", f"--key-file={key}",
                        f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                        f"--seed-file={root}/munged.seed", "--force"],
                       check=True, capture_output=True, timeout=30)
        subprocess.run(["slurmctld", "-f", conf], check=True, capture_output=True, env=env,
                       timeout=30)
        subprocess.run(["slurmd", "-f", conf], check=True, capture_output=True, env=env,
                       timeout=30)
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                   env=env, timeout=30).stdout.strip()
            if state == "idle":
                break
            if time.monotonic() > deadline:
                logs = ""
                for name in ("slurmctld.log", "slurmd.log"):
                    path = os.path.join(root, name)
                    if os.path.exists(path):
                        with open(path, encoding="utf-8", errors="replace") as handle:
                            logs += f"--- {name}\n{handle.read()[-2000:]}"
                raise RuntimeError(f"the test's Slurm node is {state!r}, not idle, after 60 s\n"
                                   f"{logs}")
            time.sleep(0.2)
        yield {"SLURM_CONF": conf}
    finally:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=env,
                       timeout=30, check=False)
        _stop(pid_files)
