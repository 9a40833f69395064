"""Property-based fuzzing of every knob from every source (issue: bad input gets a clear error).

Whatever value arrives (wrong type, negative, zero, huge, empty, unknown), `load_config` either
returns a Config whose value honours the knob's documented range, or raises one ConfigError that
names where the value came from. Nothing else may escape.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commsched.config import (
    CONFIG_ENV,
    ENV_PREFIX,
    KNOBS,
    SCRIPT_ENV,
    ConfigError,
    Kind,
    Knob,
    load_config,
)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "1e400", "nan", "inf", "-inf", "1.5", "1KiB", "2 MiB",
                     "10XB", "1e3", "0x10", "true", "auto", "horovod", "HOROVOD", "none", "null",
                     "99999999999999999999999999", "-0", "1_000", "٣", "1,5", "[]", "{}"]),
    st.text(max_size=12))
objects: st.SearchStrategy[Any] = st.one_of(
    texts, st.none(), st.booleans(), st.integers(), st.integers(min_value=2**62),
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _honours_range(knob: Knob, value: Any) -> bool:
    if knob.kind is Kind.CHOICE:
        return str(getattr(value, "value", value)) in knob.choices
    if knob.kind is Kind.PATH:
        return isinstance(value, str)
    if knob.kind is Kind.FLAG:
        return isinstance(value, bool)
    if value is None:
        return knob.default is None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return False
    if knob.kind in (Kind.BYTES, Kind.COUNT) and not float(value).is_integer():
        return False
    if knob.minimum is not None and (value <= knob.minimum if knob.exclusive_minimum
                                     else value < knob.minimum):
        return False
    return knob.maximum is None or value <= knob.maximum


def _check(knob: Knob, source_words: tuple[str, ...], **kwargs: Any) -> None:
    try:
        config = load_config(**kwargs)
    except ConfigError as err:
        message = str(err)
        assert any(word in message for word in source_words), message
        assert "\n" not in message
        return
    assert _honours_range(knob, getattr(config, knob.key)), (knob.key, getattr(config, knob.key))


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
@FUZZ
@given(text=texts)
def test_environment_values(knob: Knob, text: str) -> None:
    if "\x00" in text:  # a process environment cannot hold NUL
        return
    _check(knob, (knob.env,), environ={knob.env: text})


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
@FUZZ
@given(value=objects)
def test_keyword_values(knob: Knob, value: Any) -> None:
    _check(knob, (knob.key,), overrides={knob.key: value}, environ={})


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.key)
@FUZZ
@given(value=objects)
def test_yaml_values(knob: Knob, value: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(yaml.safe_dump({knob.key: value}))
    _check(knob, (knob.key, CONFIG_ENV), environ={CONFIG_ENV: str(path)})


@FUZZ
@given(name=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=12),
       value=texts)
def test_unknown_variables_are_named(name: str, value: str) -> None:
    variable = ENV_PREFIX + name
    if variable in {k.env for k in KNOBS} | {CONFIG_ENV, *SCRIPT_ENV}:
        return  # a knob, the preset's path, or a variable of the scripts (COMMSCHED_VENV)
    with pytest.raises(ConfigError, match=variable):
        load_config(environ={variable: value})


@FUZZ
@given(key=st.one_of(st.text(max_size=10), st.integers(), st.booleans()), value=objects)
def test_unknown_yaml_keys_are_named(key: Any, value: Any,
                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    if key in {k.key for k in KNOBS}:
        return
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(environ={CONFIG_ENV: str(path)})


@FUZZ
@given(text=st.text(max_size=40))
def test_arbitrary_yaml_documents(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(environ={CONFIG_ENV: str(path)})
    except ConfigError as err:
        assert CONFIG_ENV in str(err)
