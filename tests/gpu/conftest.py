"""tests/gpu runs only where CUDA is available (scripts/gpu_check.sh runs it on a GPU machine).
Elsewhere every test here is collected and skipped with the reason below, which the header of
the run prints too, so a CPU run says what it left out instead of passing silently."""

from __future__ import annotations

import os

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REASON = ("CUDA not available: tests/gpu needs torch.cuda.is_available() (run scripts/gpu_check.sh "
          "on a GPU machine)")


def cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def pytest_report_header(config: pytest.Config) -> str:
    if cuda_ready():
        return f"tests/gpu: on {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"tests/gpu: skipped, {REASON}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_ready():
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:  # this hook sees the whole session's items: only ours are skipped
        if os.path.abspath(str(item.path)).startswith(HERE + os.sep):
            item.add_marker(skip)
