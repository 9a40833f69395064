"""Without a GPU, the GPU check and the overhead benchmark's GPU part stop at once with one line
that says why (with one, scripts/gpu_check.sh runs the tests marked gpu)."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import torch

from benchmarks.harness import overhead

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


def test_overhead_gpu_part_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert overhead.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.cuda.is_available() is false" in err[0]


def test_gpu_check_fails_with_one_clear_line(repo_root: pathlib.Path) -> None:
    done = subprocess.run([str(repo_root / "scripts" / "gpu_check.sh")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device"), done.stderr
