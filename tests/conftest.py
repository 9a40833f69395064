"""The suite's layout and its markers (tests/README.md): a test's folder is the folder of the
package (or of the checkout) it tests, and how it runs is a marker: `processes` (ranks spawned
as local processes), `launcher` (a job started through horovodrun, torchrun, mpirun or srun),
`gpu` (needs CUDA). A test without one of them is a unit test."""

from __future__ import annotations

import functools
import os
import pathlib
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# What the tests import and the launchers run, not tests themselves: tests/support (helpers,
# launch, ...) and tests/jobs (the job scripts, launched by path; the tests read their constants).
SUPPORT_DIRS = ("support", "jobs")
for _name in reversed(SUPPORT_DIRS):
    sys.path.insert(0, os.path.join(HERE, _name))
# The benchmark harnesses (benchmarks/harness) are no part of the installed package: they import
# from the checkout, as `python -m benchmarks.harness.<name>` does from the repository root.
# Appended, so that the commsched under test stays the one the environment installed.
sys.path.append(os.path.dirname(HERE))

# How a test runs; registered in pyproject.toml (where --strict-markers makes a typo an error).
KINDS = ("processes", "launcher", "gpu")
UNIT = "unit (no marker)"
GPU_REASON = ("CUDA not available: tests marked gpu need torch.cuda.is_available() (run "
              "scripts/gpu_check.sh on a GPU machine)")


@functools.cache
def cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@pytest.fixture
def repo_root() -> pathlib.Path:
    """The checkout under test."""
    return pathlib.Path(HERE).parent


def pytest_report_header(config: pytest.Config) -> str:
    if cuda_ready():
        return f"gpu tests: on {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"gpu tests: skipped, {GPU_REASON}"


def folders_with_tests() -> list[str]:
    """Every folder under tests/ that holds a test module, relative to tests/ ('.' for tests/
    itself): found on disk, so a folder that pytest does not enter is still listed."""
    folders = []
    for root, dirs, files in os.walk(HERE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__"))
                         and not (root == HERE and d in SUPPORT_DIRS))
        if any(f.endswith(".py") and (f.startswith("test_") or f.endswith("_test.py"))
               for f in files):
            folders.append(os.path.relpath(root, HERE))
    return folders


_skipped_modules: set[str] = set()  # node ids


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module skipped as a whole (pytest.importorskip at its top) says so in the run's summary:
    # its folder was not passed over in silence.
    if report.skipped and report.nodeid.endswith(".py"):
        _skipped_modules.add(report.nodeid)


def kinds_of(item: pytest.Item) -> set[str]:
    """How `item` runs: the KINDS it is marked with, or UNIT."""
    return {kind for kind in KINDS if item.get_closest_marker(kind) is not None} or {UNIT}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpu are skipped without CUDA, with the reason (also in the run's header);
    and a whole-suite run must collect tests from every test folder and of every kind: a folder
    silently skipped (pytest ignores folders named 'dist' unless told otherwise) or a marker
    dropped would hide missing coverage."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not cuda_ready():
        skip = pytest.mark.skip(reason=GPU_REASON)
        for item in gpu_items:
            item.add_marker(skip)
    whole_suite = all(os.path.abspath(arg) == HERE for arg in config.args) and \
        not config.getoption("keyword") and not config.getoption("markexpr")
    if not whole_suite:
        return
    seen = {os.path.relpath(os.path.dirname(str(item.path)), HERE) for item in items}
    seen |= {os.path.relpath(os.path.dirname(config.rootpath / nodeid), HERE)
             for nodeid in _skipped_modules}
    missing = [folder for folder in folders_with_tests() if folder not in seen]
    if missing:
        raise pytest.UsageError("no tests collected from "
                                + ", ".join(os.path.normpath(os.path.join("tests", folder))
                                            for folder in missing))
    kinds = set().union(*(kinds_of(item) for item in items))
    absent = [kind for kind in (*KINDS, UNIT) if kind not in kinds]
    if absent:
        raise pytest.UsageError(f"no tests collected of kind {', '.join(absent)}")
