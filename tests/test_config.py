from __future__ import annotations

import re

import pytest

from commsched.config import KNOBS, ConfigError, Policy, load_config, preset_names


def test_defaults() -> None:
    cfg = load_config(environ={})
    assert cfg.policy is Policy.HOROVOD
    assert cfg.fusion_threshold is None and cfg.cycle_time == 1.0  # the policy's own
    assert cfg.fusion_bytes(Policy.HOROVOD) == cfg.fusion_bytes(Policy.MGWFBP) == 128 * 2**20
    assert cfg.fusion_bytes(Policy.DEAR) == 4 * 2**20
    assert cfg.bucket_bytes == 25 * 2**20 and cfg.first_bucket_bytes == 2**20
    assert cfg.profile_steps == 5 and cfg.timeout == 300.0 and cfg.alpha is None


def test_byte_units_and_env() -> None:
    cfg = load_config(environ={"COMMSCHED_FUSION_THRESHOLD": "64MiB",
                               "COMMSCHED_BUCKET_BYTES": "2 MB", "COMMSCHED_POLICY": "DDP"})
    assert cfg.fusion_threshold == 64 * 2**20 and cfg.bucket_bytes == 2_000_000
    assert cfg.policy is Policy.DDP


def test_precedence_kwargs_env_yaml_horovod_default(tmp_path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("policy: mgwfbp\nfusion_threshold: 1000\ncycle_time: 3\n")
    env = {"COMMSCHED_CONFIG": str(preset), "HOROVOD_FUSION_THRESHOLD": "5",
           "HOROVOD_CYCLE_TIME": "7", "COMMSCHED_CYCLE_TIME": "2"}
    cfg = load_config({"policy": "ddp"}, environ=env)
    assert cfg.policy is Policy.DDP  # keyword beats YAML
    assert cfg.cycle_time == 2.0  # env beats YAML and HOROVOD_
    assert cfg.fusion_threshold == 1000  # YAML beats HOROVOD_
    cfg = load_config(environ={"HOROVOD_FUSION_THRESHOLD": "4096", "HOROVOD_CYCLE_TIME": "0.5"})
    assert cfg.fusion_threshold == 4096 and cfg.cycle_time == 0.5


@pytest.mark.parametrize("var,value,fragment", [
    ("COMMSCHED_POLICY", "fastest", "one of horovod, ddp, mgwfbp"),
    ("COMMSCHED_TIMEOUT", "-1", "out of range"),
    ("COMMSCHED_TIMEOUT", "0", "out of range"),
    ("COMMSCHED_TIMEOUT", "soon", "a number of seconds"),
    ("COMMSCHED_FUSION_THRESHOLD", "12 parsecs", "byte size"),
    ("COMMSCHED_FUSION_THRESHOLD", "-5", "byte size"),
    ("COMMSCHED_PROFILE_STEPS", "2.5", "whole number"),
    ("COMMSCHED_CYCLE_TIME", "nan", "milliseconds"),
    ("HOROVOD_CYCLE_TIME", "fast", "HOROVOD_CYCLE_TIME"),
])
def test_bad_values_name_variable_value_and_allowed(var: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={var: value})
    message = str(err.value)
    assert var in message and repr(value) in message and fragment in message


def test_unknown_variable_and_keyword_are_errors() -> None:
    with pytest.raises(ConfigError, match="COMMSCHED_FUSION_TRESHOLD .did you mean "
                                          "'COMMSCHED_FUSION_THRESHOLD'"):
        load_config(environ={"COMMSCHED_FUSION_TRESHOLD": "1"})
    with pytest.raises(ConfigError, match="unknown keyword argument 'bucket' .did you mean "
                                          "'bucket_bytes'.*; known: policy"):
        load_config({"bucket": 3}, environ={})
    with pytest.raises(ConfigError, match="unknown keyword argument 'zzz'; known: policy"):
        load_config({"zzz": 3}, environ={})  # nothing close: no guess


def test_yaml_errors(tmp_path) -> None:
    bad_key = tmp_path / "a.yaml"
    bad_key.write_text("polcy: ddp\n")
    with pytest.raises(ConfigError, match="unknown key 'polcy' .did you mean 'policy'"):
        load_config(environ={"COMMSCHED_CONFIG": str(bad_key)})
    bad_value = tmp_path / "b.yaml"
    bad_value.write_text("timeout: [1, 2]\n")
    with pytest.raises(ConfigError, match="YAML key 'timeout'"):
        load_config(environ={"COMMSCHED_CONFIG": str(bad_value)})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(environ={"COMMSCHED_CONFIG": str(tmp_path / "missing.yaml")})
    not_mapping = tmp_path / "c.yaml"
    not_mapping.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(environ={"COMMSCHED_CONFIG": str(not_mapping)})


def test_presets_load_by_name_and_by_path(repo_root) -> None:
    """The presets are package data (setup.cfg), so an installed commsched has them too."""
    assert preset_names() == sorted(p.value for p in Policy)
    for policy in Policy:
        path = repo_root / "commsched" / "presets" / f"{policy.value}.yaml"
        assert load_config(environ={"COMMSCHED_CONFIG": str(path)}).policy is policy
        assert load_config(environ={"COMMSCHED_CONFIG": policy.value}).policy is policy
    assert load_config(environ={"COMMSCHED_CONFIG": "dear"}).fusion_threshold == 4 << 20
    with pytest.raises(ConfigError, match=r"COMMSCHED_CONFIG='daer': no such file, and no preset "
                                          r"of that name \(did you mean 'dear'\?\)"):
        load_config(environ={"COMMSCHED_CONFIG": "daer"})


def test_readme_documents_every_knob(repo_root) -> None:
    readme = (repo_root / "README.md").read_text()
    for knob in KNOBS:
        assert f"`{knob.env}`" in readme, f"{knob.env} missing from the README knobs table"


def test_readme_gives_every_knobs_bounds(repo_root) -> None:
    """The table's "allowed" cell names each knob's largest value too (a user's 20000 profile
    steps must not be a surprise), in the form the error message prints it."""
    cells = {row.split("|")[1].strip(): row.split("|")[3]
             for row in (repo_root / "README.md").read_text().splitlines()
             if row.startswith("| `COMMSCHED_")}
    for knob in KNOBS:
        cell = cells[f"`{knob.env}`"]
        if knob.maximum is not None:
            bound = re.escape(knob._bound(knob.maximum))
            # "0–604800", "≤ 1", "> 0, ≤ 604800": the bound whole, after a dash or a sign.
            assert re.search(rf"(–|≤ ){bound}(?![\d.])", cell), (knob.env, cell)
        if knob.minimum is not None:
            low = re.escape(knob._bound(knob.minimum))
            assert re.search(rf"(^|[ ≥>]){low}(?![\d.])", cell.strip()), (knob.env, cell)


def test_a_byte_sizes_bound_is_printed_in_a_unit_it_can_be_given_in() -> None:
    with pytest.raises(ConfigError, match=r"<= 1024GiB"):
        load_config({"credit_bytes": "2048GiB"}, environ={})
    assert load_config({"credit_bytes": "1024GiB"}, environ={}).credit_bytes == 1 << 40


def test_a_misspelt_choice_gets_the_closest_one_suggested() -> None:
    with pytest.raises(ConfigError, match=r"COMMSCHED_POLICY='bytesheduler' is invalid: expected "
                                          r"one of .* \(did you mean 'bytescheduler'\?\)$"):
        load_config({}, environ={"COMMSCHED_POLICY": "bytesheduler"})
    with pytest.raises(ConfigError) as nothing_close:
        load_config({"compression": "zstd"}, environ={})
    assert "did you mean" not in str(nothing_close.value)


def test_a_scripts_variable_is_not_an_unknown_knob() -> None:
    """scripts/setup.sh reads COMMSCHED_VENV; exported, it must not stop commsched."""
    assert load_config(environ={"COMMSCHED_VENV": "/tmp/venv"}).policy.value == "horovod"
    with pytest.raises(ConfigError, match="unknown environment variable COMMSCHED_VENVV"):
        load_config(environ={"COMMSCHED_VENVV": "/tmp/venv"})


def test_horovods_timeline_and_autotune_variables_are_honoured() -> None:
    cfg = load_config(environ={"HOROVOD_TIMELINE": "/tmp/hvd.json", "HOROVOD_AUTOTUNE": "1"})
    assert cfg.timeline == "/tmp/hvd.json" and cfg.policy is Policy.AUTO
    assert load_config(environ={"HOROVOD_AUTOTUNE": "0"}).policy is Policy.HOROVOD
    assert load_config(environ={"HOROVOD_TIMELINE": "DYNAMIC"}).timeline == ""  # hvd's API
    both = {"HOROVOD_AUTOTUNE": "1", "COMMSCHED_POLICY": "ddp", "COMMSCHED_TIMELINE": "/tmp/c"}
    assert load_config(environ={**both, "HOROVOD_TIMELINE": "/tmp/h"}).policy is Policy.DDP
    assert load_config(environ={**both, "HOROVOD_TIMELINE": "/tmp/h"}).timeline == "/tmp/c"
    with pytest.raises(ConfigError, match=r"HOROVOD_AUTOTUNE='sometimes' is invalid: expected "
                                          r"a boolean"):
        load_config(environ={"HOROVOD_AUTOTUNE": "sometimes"})
