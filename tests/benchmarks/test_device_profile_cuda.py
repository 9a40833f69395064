"""benchmarks.harness.device_profile on CUDA: the free-running plain step is timed in a child
without CUDA_LAUNCH_BLOCKING, the profile with it (Note [Device time on the host's clock]), and
the profile's compute comes within a factor of that step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_resnet50_recording_on_the_gpu(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "resnet50")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_LAUNCH_BLOCKING"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.harness.device_profile", "--model",
                           "resnet50", "--device", "cuda", "--batch-size", "16", "--steps", "10",
                           "--out", out], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(out, "recording.json"), encoding="utf-8") as handle:
        recording = json.load(handle)
    assert recording["launch_blocking"] is True and recording["inputs"] == "full"
    assert 0.5 < recording["profile_compute_ms"] / recording["plain_ms"] < 3.0, recording
    with open(os.path.join(out, "profile.json"), encoding="utf-8") as handle:
        clocks = json.load(handle)["clocks"]
    assert clocks["ready_time_s"] == "device_event"
