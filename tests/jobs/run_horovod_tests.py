"""One rank of the Horovod-compatibility job: runs horovod_torch_tests.py (Horovod 0.28.1's own
optimizer tests with commsched's optimizer and broadcasts) under pytest and writes each test's
outcome on this rank to ``<out>.rank<N>.json``. Launched on every rank by
``horovodrun -np 2 --gloo`` from test_horovod_compat.py; all tests run in this one job."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "horovod_torch_tests.py")
# A hung test fails alone (pytest-timeout) rather than holding the whole job until its limit.
TEST_TIMEOUT_S = 120


class Recorder:
    """Collects each test's outcome: the call's, or the setup's when it was skipped or failed
    there, or the teardown's when only that failed."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, Any]] = {}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.outcomes["<collection>"] = {"outcome": "failed", "text": report.longreprtext}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.rsplit("::", 1)[-1]
        entry = self.outcomes.setdefault(name, {"outcome": "passed", "text": ""})
        if report.when == "call" or report.outcome != "passed":
            if entry["outcome"] == "passed" or report.when == "call":
                entry["outcome"] = report.outcome
            if report.outcome != "passed":
                entry["text"] += f"[{report.when}] {report.longreprtext[-3000:]}\n"
        if report.when == "teardown":
            # Threads of this process after the test: a wrapped optimizer that is dropped must
            # release its engine's and its groups' threads (test_horovod_compat checks this).
            entry["threads_after"] = len(os.listdir("/proc/self/task"))


def main(out: str, *pytest_args: str) -> int:
    recorder = Recorder()
    code = pytest.main([TESTS, *pytest_args, "-q", "-p", "no:cacheprovider",
                        f"--timeout={TEST_TIMEOUT_S}"],
                       plugins=[recorder])
    rank = os.environ.get("HOROVOD_RANK", "0")
    with open(f"{out}.rank{rank}.json", "w", encoding="utf-8") as handle:
        json.dump({"exit_code": int(code), "tests": recorder.outcomes}, handle, indent=1)
    import commsched

    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
