"""Runs a launcher command (horovodrun, torchrun) as its own process group with a hard timeout,
and (`job_results`) a horovodrun job whose JSON result every test case of that job reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The job scripts the launchers run, by path (tests/jobs).
JOBS = os.path.join(REPO, "tests", "jobs")


def run_command(args: list[str], timeout: float, cwd: str, env: dict[str, str],
                expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Runs `args` as its own process group, output and errors together; kills the whole group
    after `timeout` and fails naming the command (and, with `expect_ok`, on a non-zero exit)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(
            f"{args[0]} hung: killed after {timeout:.0f} s\n{output[-4000:]}") from None
    result = subprocess.CompletedProcess(args, proc.returncode, output, "")
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n{output[-6000:]}")
    return result


def run_job(args: list[str], timeout: float, env: dict[str, str] | None = None,
            expect_ok: bool = True) -> subprocess.CompletedProcess:
    # Horovod's own Gloo loop gives up after 30 s by default; 3 ranks on 2 cores can starve a
    # rank for a while (seen once in about ten 3-rank overlap jobs).
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
                **(env or {})}
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    return run_command(args, timeout, REPO, full_env, expect_ok)


def run_tag() -> str:
    """A word for a job's command line that names this pytest process: what a test then finds
    still running with it is its own job's, not a job of the suite's other worker that runs the
    same script (tests/README.md, Two workers)."""
    return f"pytest-{os.getpid()}"


def left_running(script: str, tag: str, grace_s: float = 10.0) -> list[str]:
    """The processes still running `script` with `tag` among their arguments (pgrep -af) once
    up to `grace_s` have passed for the launcher's own clean-up; [] as soon as none is."""
    deadline = time.monotonic() + grace_s
    while True:
        out = subprocess.run(["pgrep", "-af", script], capture_output=True, text=True,
                             check=False).stdout
        left = [line for line in out.splitlines()
                if "pgrep" not in line and tag in line.split()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


def horovodrun(np: int, script: str, *script_args: str, timeout: float = 300,
               env: dict[str, str] | None = None,
               expect_ok: bool = True) -> subprocess.CompletedProcess:
    return run_job([os.path.join(BIN, "horovodrun"), "-np", str(np), "--gloo", sys.executable,
                    script, *script_args], timeout, env, expect_ok)


def torchrun(np: int, script: str, *script_args: str, timeout: float = 300,
             env: dict[str, str] | None = None,
             expect_ok: bool = True) -> subprocess.CompletedProcess:
    return run_job([os.path.join(BIN, "torchrun"), "--standalone", f"--nproc_per_node={np}",
                    script, *script_args], timeout, env, expect_ok)


_job_results: dict[tuple[str, int], dict[str, Any]] = {}


def job_results(np: int, script: str, tmp_dir: str, timeout: float,
                env: dict[str, str] | None = None,
                explain: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The JSON document that `script`, run under horovodrun on `np` ranks, writes to the path
    given as its one argument. Each (script, np) is launched once per test session and every
    test case of it reads the same document; a failed launch is not kept (the next case tries
    again). `explain(path)`, if given, adds to a failed launch's message (e.g. per-rank
    progress files written next to the path)."""
    key = (script, np)
    if key not in _job_results:
        stem = os.path.splitext(os.path.basename(script))[0]
        out = os.path.join(tmp_dir, f"{stem}.np{np}.json")
        try:
            horovodrun(np, script, out, timeout=timeout, env=env)
        except AssertionError as err:
            if explain is None:
                raise
            raise AssertionError(f"{err}\n{explain(out)}") from None
        with open(out, encoding="utf-8") as handle:
            _job_results[key] = json.load(handle)
    return _job_results[key]


def rank_outcomes(document: dict[str, Any], key: str, np: int) -> list[dict[str, Any]]:
    """Every rank's outcome of configuration `key` in a `job_results` document (written through
    job_results.gather_and_write), after checking that all `np` ranks reported and none raised."""
    assert document["size"] == np, f"the job ran on {document['size']} ranks, not {np}"
    outcomes: list[dict[str, Any]] = document["results"][key]["ranks"]
    assert len(outcomes) == np, f"{key}: {len(outcomes)} ranks reported, not {np}"
    for rank, outcome in enumerate(outcomes):
        assert "error" not in outcome, f"rank {rank}: {key} raised: {outcome.get('error')}"
    return outcomes
