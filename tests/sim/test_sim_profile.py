"""Reading profile documents: schema 1 and 2, fallbacks, and errors that name the field."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from commsched.sim import (
    ProfileError,
    load_profile,
    profile_from_document,
    ready_profile,
    specs_from_profile,
)


def tensor(i: int, name: str, numel: int, ready: float | None, module: str | None = None,
           dtype: str = "float32") -> dict:
    return {"id": i, "name": name, "numel": numel, "dtype": dtype, "bytes": 4 * numel,
            "forward_index": i, "ready_time_s": ready, "module": module}


def document() -> dict:
    return {"schema_version": 2, "world_size": 2, "iterations": 5,
            "compute": {"before_first_ready_s": 0.05, "step_s": 0.004},
            "tensors": [tensor(0, "a.weight", 250, 0.01, "a"),
                        tensor(1, "b.weight", 750, 0.0, "b")],
            "modules": [{"name": "", "forward_order": 0, "forward_time_s": 0.03,
                         "self_time_s": 0.0},
                        {"name": "a", "forward_order": 1, "forward_time_s": 0.01,
                         "self_time_s": 0.01},
                        {"name": "b", "forward_order": 2, "forward_time_s": 0.02,
                         "self_time_s": 0.02}]}


def error_of(doc: dict) -> str:
    with pytest.raises(ProfileError) as info:
        profile_from_document(doc)
    return str(info.value)


def test_schema_2_document() -> None:
    run = profile_from_document(document())
    assert run.world_size == 2 and run.before_first_ready_s == 0.05 and run.step_s == 0.004
    assert [t.module for t in run.tensors] == ["a", "b"]
    assert [m.self_time_s for m in run.modules] == [0.0, 0.01, 0.02]
    assert run.has_module_info and run.total_bytes == 4000
    specs = specs_from_profile(run)
    assert [(s.tensor_id, s.numel, s.element_size, s.forward_index) for s in specs] == \
        [(0, 250, 4, 0), (1, 750, 4, 1)]
    assert ready_profile(run).ready_times == (0.01, 0.0)


def test_schema_1_fields_count_as_missing() -> None:
    doc = document()
    doc["schema_version"] = 1
    del doc["compute"]
    run = profile_from_document(doc)
    assert run.before_first_ready_s is None and run.step_s is None
    assert all(t.module is None for t in run.tensors)  # v1 had no `module`
    assert all(m.self_time_s is None for m in run.modules)
    assert not run.has_module_info


def test_element_size_from_dtype() -> None:
    doc = document()
    doc["tensors"][1] = tensor(1, "b.weight", 750, 0.0, "b", dtype="float16")
    doc["tensors"][1]["bytes"] = 1500
    assert specs_from_profile(profile_from_document(doc))[1].element_size == 2
    # an unknown dtype is accepted when its bytes tell the element size
    doc["tensors"][1]["dtype"] = "float4_custom"
    doc["tensors"][1]["bytes"] = 750
    assert specs_from_profile(profile_from_document(doc))[1].element_size == 1


def test_unmeasured_ready_times_give_an_empty_planner_profile() -> None:
    doc = document()
    for row in doc["tensors"]:
        row["ready_time_s"] = None
    assert not ready_profile(profile_from_document(doc)).measured


def test_missing_field_is_named() -> None:
    doc = document()
    del doc["tensors"][1]["numel"]
    message = error_of(doc)
    assert "tensors[1] ('b.weight').numel" in message
    assert "missing" in message


def test_wrong_type_is_named_with_the_value() -> None:
    doc = document()
    doc["tensors"][0]["numel"] = "250"
    assert error_of(doc) == ("profile profile: tensors[0] ('a.weight').numel: expected a whole "
                             'number >= 0, got "250"')
    doc = document()
    doc["compute"]["step_s"] = -1
    assert "compute.step_s: expected a number of seconds >= 0 or null, got -1" in error_of(doc)
    doc = document()
    doc["tensors"][0]["ready_time_s"] = "soon"
    assert "tensors[0] ('a.weight').ready_time_s" in error_of(doc)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.update(schema_version=3), "schema_version: expected 1 or 2, got 3"),
    (lambda d: d.update(tensors=[]), "tensors: expected a non-empty list"),
    (lambda d: d["tensors"][0].update(bytes=999), "bytes: expected numel x 4"),
    (lambda d: d["tensors"][0].update(dtype="mystery", bytes=None), "dtype: expected a known"),
    (lambda d: d["tensors"][1].update(id=5), "ids 0..1, each once"),
    (lambda d: d["tensors"][0].update(module="nowhere"), 'listed in \'modules\', got "nowhere"'),
    (lambda d: d.update(collectives={"broadcast": {}}), "collectives.broadcast"),
    (lambda d: d.update(collectives={"allreduce": {"alpha_s": 1e-4}}),
     "collectives.allreduce.beta_s_per_byte"),
    (lambda d: d["modules"][1].update(forward_order=None), "modules[1] ('a').forward_order"),
])
def test_malformed_documents(change: Callable[[dict], object], expected: str) -> None:
    doc = copy.deepcopy(document())
    change(doc)
    assert expected in error_of(doc)


def test_not_an_object() -> None:
    assert "the document: expected a JSON object" in error_of([1, 2])  # type: ignore[arg-type]


def test_load_profile_from_path_and_builtin(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(document()))
    assert len(load_profile(path).tensors) == 2
    assert load_profile("resnet50").has_module_info
    with pytest.raises(ProfileError, match="no such file, and not a built-in profile"):
        load_profile(tmp_path / "missing.json")
    path.write_text("{\"schema_version\": 2, ")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(path)
