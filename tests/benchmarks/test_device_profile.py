"""benchmarks.harness.device_profile on CPU (its CUDA path is
tests/benchmarks/test_device_profile_cuda.py)
and the GPU section scripts/scale_report.py renders from its output: one recording, simulated
and reported as scripts/device_scale.sh does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commsched.bench.real_models import Inputs, RealModel, batch, build
from commsched.sim.floor import profile_compute_s
from commsched.sim.profile import profile_from_document

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import scale_report  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """ResNet-50 recorded on CPU at reduced inputs, then swept as device_scale.sh sweeps."""
    root = str(tmp_path_factory.mktemp("scale"))
    folder = os.path.join(root, "gpu", "resnet50")
    done = _run("-m", "benchmarks.harness.device_profile", "--model", "resnet50", "--device", "cpu",
                "--inputs", "reduced", "--batch-size", "2", "--steps", "8", "--warmup", "1",
                "--timed", "3", "--out", folder)
    assert done.returncode == 0, done.stderr[-2000:]
    done = _run("-m", "commsched", "simulate", "--profile", os.path.join(folder, "profile.json"),
                "--workers", "8,64", "--bandwidth", "10gbit", "--latency", "20us",
                "--algorithm", "ring", "--policy", "all", "--compression", "1,powersgd:4",
                "--json", os.path.join(folder, "results.json"),
                "--markdown", os.path.join(folder, "table.md"))
    assert done.returncode == 0, done.stderr[-2000:]
    return root


def test_the_profile_holds_every_gradient_and_the_forward_modules(recorded: str) -> None:
    with open(os.path.join(recorded, "gpu", "resnet50", "profile.json"), encoding="utf-8") as f:
        run = profile_from_document(json.load(f))
    model = build(RealModel.RESNET50)
    assert [t.name for t in run.tensors] == [n for n, _ in model.named_parameters()]
    assert run.total_bytes == sum(4 * p.numel() for p in model.parameters())
    assert run.has_module_info  # the simulator's deadlines need them (Note [The floor's windows])


def test_the_recording_sets_the_profile_beside_the_plain_step(recorded: str) -> None:
    folder = os.path.join(recorded, "gpu", "resnet50")
    with open(os.path.join(folder, "recording.json"), encoding="utf-8") as f:
        recording = json.load(f)
    with open(os.path.join(folder, "profile.json"), encoding="utf-8") as f:
        compute_ms = 1e3 * profile_compute_s(profile_from_document(json.load(f)))
    assert recording["profile_compute_ms"] == pytest.approx(compute_ms)
    assert recording["launch_blocking"] is False  # only CUDA blocks its launches
    assert recording["device_name"]  # from the recording's own process
    assert (recording["model"], recording["batch_size"], recording["inputs"]) == \
        ("resnet50", 2, "reduced")
    # Same model, same batch, same core: the profile's forward, backward and update come to
    # the plain step within a factor that only a missing part of the step would break. Each
    # as CPU time (Note [A CPU step's share of its core] in
    # benchmarks/harness/device_profile.py): the suite's other worker may slow one child and
    # not the other (seen: 864 ms against 225 ms in wall time).
    assert recording["plain_cpu_share"] > 0 and recording["recording_cpu_share"] > 0, recording
    ratio = (compute_ms * recording["recording_cpu_share"]) \
        / (recording["plain_ms"] * recording["plain_cpu_share"])
    assert 0.4 < ratio < 2.5, (ratio, recording)


def test_the_report_shows_the_validation_row_and_the_sweep(recorded: str) -> None:
    text = "\n".join(scale_report.device_lines(recorded, [], "cmd", "test machine",
                                               ["resnet50"]))
    assert "## resnet50 on the GPU" in text
    assert "| 8 | 10 Gbit/s |" in text and "| 64 | 10 Gbit/s |" in text
    assert "[gpu/resnet50/table.md](gpu/resnet50/table.md)" in text
    assert "scaling.png" not in text  # no plot was asked for, so none is linked
    assert "No job finished" in text  # the CPU-rank jobs: none here


def test_full_inputs_are_what_the_models_train_on() -> None:
    images, labels = batch(RealModel.VGG16, 2, 0, 0, Inputs.FULL)
    assert images.shape == (2, 3, 224, 224) and labels.shape == (2,)
    tokens, targets = batch(RealModel.GPT2, 1, 0, 0, Inputs.FULL)
    assert tokens.shape == targets.shape == (1, 1024)
    assert batch(RealModel.BERT, 1, 0, 0, Inputs.FULL)[0].shape == (1, 128)
    assert batch(RealModel.BERT, 1, 0, 0)[0].shape == (1, 64)  # reduced stays the default


def test_a_recording_without_out_is_refused() -> None:
    done = _run("-m", "benchmarks.harness.device_profile", "--model", "resnet50", "--device", "cpu")
    assert done.returncode == 2 and "--out is required" in done.stderr


def test_only_the_recording_child_blocks_its_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Device time on the host's clock]: the variable reaches the recording's process
    only, never the plain step's, even when the parent has it."""
    from benchmarks.harness import device_profile

    seen: dict[str, dict[str, str]] = {}

    def fake_run(command: list[str], env: dict[str, str], **_: object) -> object:
        seen[command[-1]] = env
        return subprocess.CompletedProcess(command, 0, stdout="{}\n", stderr="")

    monkeypatch.setattr(device_profile.subprocess, "run", fake_run)
    monkeypatch.setenv(device_profile.BLOCKING, "1")
    args = device_profile._parser().parse_args(
        ["--model", "gpt2", "--device", "cuda", "--batch-size", "8", "--out", "x"])
    device_profile._child(args, "--plain-only", blocking=False)
    device_profile._child(args, "--record-only", blocking=True)
    assert device_profile.BLOCKING not in seen["--plain-only"]
    assert seen["--record-only"][device_profile.BLOCKING] == "1"
