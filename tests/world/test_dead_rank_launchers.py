"""A rank that dies mid-backward under horovodrun and torchrun: the launcher exits non-zero and
names the dead rank, and no process of the job is left behind. Both launchers terminate the
survivors as soon as one worker exits non-zero, usually before their own error (which names the
dead rank too: tests/world/test_faults_dist.py, where nothing kills the survivors) is printed."""

from __future__ import annotations

import os
import time

import pytest
from launch import JOBS, horovodrun, left_running, run_tag, torchrun

pytestmark = pytest.mark.launcher

JOB = os.path.join(JOBS, "dead_rank_job.py")


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_dead_rank_fails_the_job_cleanly(launcher: str) -> None:
    run = horovodrun if launcher == "horovodrun" else torchrun
    started = time.monotonic()
    result = run(2, JOB, "bytescheduler", "dead", run_tag(), timeout=120, expect_ok=False)
    assert result.returncode != 0, result.stdout[-3000:]
    named = "Process 1 exit with status code 3" if launcher == "horovodrun" else "exitcode  : 3"
    assert named in result.stdout or "rank 1's process (pid " in result.stdout, \
        result.stdout[-4000:]
    assert "finished although" not in result.stdout
    assert time.monotonic() - started < 20 + 10 + 30  # COMMSCHED_TIMEOUT + 10 s + start-up
    left = left_running(JOB, run_tag())
    assert not left, left
