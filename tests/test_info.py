"""`python -m commsched info` (commsched/info.py), the knobs' sources (config.knob_sources), the
extension's build check, and the error a missing Horovod raises."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from commsched.config import KNOBS, Source, knob_sources, load_config
from commsched.info import ExtensionBuildError, check_extension
from commsched.world.errors import HorovodMissingError, import_horovod

PACKAGE = Path(__file__).resolve().parents[1] / "commsched"


def _info(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m commsched info` in a clean environment plus `env`, run from `cwd`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("COMMSCHED_", "HOROVOD_")) and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "commsched", "info"], cwd=cwd, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def _knob_line(stdout: str, key: str) -> str:
    match = re.search(rf"^  {key} +(.*)$", stdout, re.MULTILINE)
    assert match, stdout
    return re.sub(r"\s+", " ", match.group(1).strip())


def test_info_prints_each_knobs_value_and_source(tmp_path: Path) -> None:
    preset = tmp_path / "preset.yaml"
    preset.write_text("policy: dear\ncycle_time: 3\n", encoding="utf-8")
    result = _info({"COMMSCHED_POLICY": "mgwfbp", "COMMSCHED_CONFIG": str(preset),
                    "HOROVOD_FUSION_THRESHOLD": "8MiB", "HOROVOD_CYCLE_TIME": "9"}, tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The environment beats the YAML file, which beats Horovod's twin, which beats the default.
    assert _knob_line(out, "policy") == "mgwfbp environment variable COMMSCHED_POLICY"
    assert _knob_line(out, "cycle_time") == f"3.0 YAML key 'cycle_time' in {preset}"
    assert _knob_line(out, "fusion_threshold") == \
        "8388608 environment variable HOROVOD_FUSION_THRESHOLD (Horovod's twin)"
    assert _knob_line(out, "timeout") == "300.0 default"
    assert _knob_line(out, "stall_warning") == "60.0 default (a fifth of timeout)"
    assert _knob_line(out, "alpha") == "unset default"
    assert len(re.findall(r"^  \w+ ", out, re.MULTILINE)) == len(KNOBS)

    assert f"torch: {torch.__version__} " in out
    assert f"commsched._C: built against torch {torch.__version__} (this torch)" in out
    assert re.search(r"^  backends: Gloo yes, NCCL (yes|no), MPI (yes|no)$", out, re.MULTILINE)
    assert re.search(r"^CUDA: ", out, re.MULTILINE)
    horovod_line = re.search(r"^Horovod: (.*)$", out, re.MULTILINE)
    assert horovod_line, out
    if importlib.util.find_spec("horovod") is None:
        assert horovod_line.group(1).startswith("not installed"), out
    else:
        assert horovod_line.group(1).startswith("0.28.1 (built against torch "), out


def test_info_names_the_bad_knob_and_fails(tmp_path: Path) -> None:
    result = _info({"COMMSCHED_POLICY": "bytesheduler"}, tmp_path)
    assert result.returncode == 1
    assert "COMMSCHED_POLICY='bytesheduler' is invalid" in result.stdout
    assert "did you mean 'bytescheduler'?" in result.stdout


def test_knob_sources_follow_load_configs_precedence(tmp_path: Path) -> None:
    preset = tmp_path / "preset.yaml"
    preset.write_text("policy: dear\ncycle_time: 3\ntimeout: 50\n", encoding="utf-8")
    env = {"COMMSCHED_CONFIG": str(preset), "COMMSCHED_TIMEOUT": "40",
           "HOROVOD_CYCLE_TIME": "9", "HOROVOD_FUSION_THRESHOLD": "1MB"}
    overrides = {"policy": "ddp", "credit_bytes": None}
    sources = knob_sources(overrides, env)
    config = load_config(overrides, env)
    assert list(sources) == [k.key for k in KNOBS]
    assert {k: s.value for k, s in sources.items()} == config.as_dict() | {"policy": config.policy}
    assert (sources["policy"].source, sources["policy"].where) == \
        (Source.ARGUMENT, "argument policy")
    assert sources["timeout"].source is Source.ENVIRONMENT
    assert sources["cycle_time"].where == f"YAML key 'cycle_time' in {preset}"
    assert (sources["fusion_threshold"].source, sources["fusion_threshold"].value) == \
        (Source.HOROVOD_TWIN, 1_000_000)
    assert sources["credit_bytes"].source is Source.DEFAULT  # None is no keyword argument
    assert sources["stall_warning"].value == 8.0  # a fifth of the timeout from the environment


def test_a_torch_mismatch_is_one_error_naming_both_versions(tmp_path: Path) -> None:
    """A copy of the package whose build record names another torch: importing it (here
    through `info`) refuses before loading the extension, with one error whose message names
    both versions and the fix, and status 1."""
    shutil.copytree(PACKAGE, tmp_path / "commsched",
                    ignore=shutil.ignore_patterns("__pycache__", "_build_info.json"))
    (tmp_path / "commsched" / "_build_info.json").write_text(
        json.dumps({"torch": "2.4.1", "python": "3.11.7"}), encoding="utf-8")
    result = _info({}, tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = [line for line in result.stderr.strip().splitlines() if "Error: " in line]
    assert len(lines) == 1 and lines[0].startswith("commsched.info.ExtensionBuildError: "), \
        result.stderr
    assert f"the extension commsched._C ({tmp_path / 'commsched'}" in lines[0]
    assert f"built against torch 2.4.1, but this process runs torch {torch.__version__}" in lines[0]
    assert "pip install --no-build-isolation --force-reinstall ." in lines[0]


def test_an_undefined_symbol_becomes_the_same_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A real extension module whose load fails on an undefined symbol, as one built against
    another torch does."""
    source = tmp_path / "broken.c"
    source.write_text("extern void *c10_symbol_of_another_torch(void);\n"
                      "void *PyInit_broken_ext(void) { return c10_symbol_of_another_torch(); }\n",
                      encoding="utf-8")
    library = tmp_path / ("broken_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True,
                   timeout=60)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ExtensionBuildError) as caught:
        check_extension("broken_ext", info={"torch": torch.__version__})
    message = str(caught.value)
    assert f"broken_ext ({library}) does not match this torch (an undefined symbol)" in message
    assert f"built against torch {torch.__version__}, this process runs torch" in message
    assert "c10_symbol_of_another_torch" in message
    assert "pip install --no-build-isolation --force-reinstall ." in message
    assert "broken_ext" not in sys.modules


def test_a_missing_extension_says_it_is_not_built() -> None:
    with pytest.raises(ExtensionBuildError, match=r"commsched\._not_built is not built: .*"
                       r"built against torch unknown \(no build record\)"):
        check_extension("commsched._not_built", info={})


def test_the_installed_extension_passes_the_check() -> None:
    assert check_extension() is sys.modules["commsched._C"]


def test_a_missing_horovod_names_what_to_install() -> None:
    with pytest.raises(HorovodMissingError) as caught:
        import_horovod("this process was started by horovodrun (HOROVOD_RANK is set)",
                       module="horovod_not_there.torch")
    assert str(caught.value).startswith(
        "commsched: this process was started by horovodrun (HOROVOD_RANK is set) but horovod is "
        "not importable (horovod_not_there.torch: No module named 'horovod_not_there'): install "
        "it with scripts/install_horovod.sh")
    assert isinstance(caught.value, ImportError)
