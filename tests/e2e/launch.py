"""Runs a launcher command (horovodrun, torchrun) as its own process group with a hard timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_job(args: list[str], timeout: float, env: dict[str, str] | None = None,
            expect_ok: bool = True) -> subprocess.CompletedProcess:
    # Horovod's own Gloo loop gives up after 30 s by default; 3 ranks on 2 cores can starve a
    # rank for a while (seen once in about ten 3-rank overlap jobs).
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
                **(env or {})}
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    proc = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{args[0]} hung: killed after {timeout:.0f} s\n{output[-4000:]}") from None
    result = subprocess.CompletedProcess(args, proc.returncode, output, "")
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n{output[-6000:]}")
    return result


def horovodrun(np: int, script: str, *script_args: str, timeout: float = 300,
               env: dict[str, str] | None = None, expect_ok: bool = True):
    return run_job([os.path.join(BIN, "horovodrun"), "-np", str(np), "--gloo", sys.executable,
                    script, *script_args], timeout, env, expect_ok)


def torchrun(np: int, script: str, *script_args: str, timeout: float = 300,
             env: dict[str, str] | None = None, expect_ok: bool = True):
    return run_job([os.path.join(BIN, "torchrun"), "--standalone", f"--nproc_per_node={np}",
                    script, *script_args], timeout, env, expect_ok)
