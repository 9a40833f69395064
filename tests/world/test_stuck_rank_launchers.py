"""A rank that is alive but stuck (dead_rank_job.py POLICY stuck) under horovodrun and
torchrun: rank 0's uncaught RankFailureError names it and how it is stuck, within
COMMSCHED_TIMEOUT + 10 s, the launcher exits non-zero, and no process of the job is left
behind."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from dead_rank_job import STUCK_TIMEOUT as TIMEOUT
from launch import JOBS, horovodrun, left_running, run_tag, torchrun

pytestmark = pytest.mark.launcher

JOB = os.path.join(JOBS, "dead_rank_job.py")
START_UP = 40.0  # the launcher, torch imports and rendezvous on a loaded 2-core machine


CASES = [("horovodrun", "horovod"), ("torchrun", "bytescheduler")]


@pytest.fixture(scope="module")
def stuck_jobs() -> dict[tuple[str, str], Future[tuple[float, subprocess.CompletedProcess]]]:
    """Both launchers' jobs, run at once: each mostly waits out the stuck rank's timeout. Each
    future, done once the fixture returns, holds its job's elapsed time and the launcher's
    result, or what the launch raised."""
    def one(case: tuple[str, str]) -> tuple[float, subprocess.CompletedProcess]:
        launcher, policy = case
        run = horovodrun if launcher == "horovodrun" else torchrun
        started = time.monotonic()
        result = run(2, JOB, policy, "stuck", run_tag(), timeout=START_UP + TIMEOUT + 60,
                     expect_ok=False)
        return time.monotonic() - started, result

    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        return {case: pool.submit(one, case) for case in CASES}


@pytest.mark.parametrize("launcher,policy", CASES)
def test_stuck_rank_fails_the_job_naming_it(stuck_jobs: dict, launcher: str,
                                            policy: str) -> None:
    elapsed, result = stuck_jobs[(launcher, policy)].result()
    assert result.returncode != 0, result.stdout[-3000:]
    assert "RankFailureError: rank 1 is stuck after backward, before step(), in iteration 4" \
        in result.stdout, result.stdout[-4000:]
    assert "finished although" not in result.stdout
    assert elapsed < START_UP + TIMEOUT + 10, (elapsed, result.stdout[-3000:])
    # Both jobs have ended (the fixture waited for them): no process of either is left.
    left = left_running(JOB, run_tag())
    assert not left, left
