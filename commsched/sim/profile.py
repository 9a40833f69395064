"""Reading the profiler's JSON (docs/profile.md, schema 1 or 2) into a checked RunProfile.

Every malformed field raises ProfileError naming the field (and the tensor or module it belongs
to) and what was expected, so a hand-edited or truncated profile fails with a sentence, not a
KeyError deep inside the simulator.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..plan import Collective, NetModel, Profile, TensorSpec

SCHEMA_VERSIONS = (1, 2)

# Bytes per element of the dtype names the profiler writes (str(torch.dtype) without "torch.").
ELEMENT_SIZES = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "complex128": 16, "complex64": 8, "int64": 8,
    "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1, "bool": 1,
}

# The profile document names collectives the way the timeline does.
OP_NAMES = {"allreduce": Collective.ALLREDUCE, "reduce_scatter": Collective.REDUCE_SCATTER,
            "all_gather": Collective.ALL_GATHER}

BUILTIN_PROFILES = ("resnet50", "vgg16", "bert-base")


class ProfileError(ValueError):
    """The profile document is not what docs/profile.md describes."""


@dataclass(frozen=True)
class TensorRecord(TensorSpec):
    """A tensor as the profile describes it: the planner's spec, plus what was measured."""

    ready_time_s: float | None = None
    module: str | None = None  # its first user in forward order (null without model=)
    shape: tuple[int, ...] | None = None  # optional: PowerSGD's factors need the matrix view


@dataclass(frozen=True)
class ModuleRecord:
    name: str
    forward_order: int
    forward_time_s: float | None
    self_time_s: float | None


@dataclass(frozen=True)
class RunProfile:
    """One profile document, checked. Times are seconds; `None` means not measured."""

    schema_version: int
    world_size: int | None
    tensors: tuple[TensorRecord, ...]
    modules: tuple[ModuleRecord, ...] = ()
    before_first_ready_s: float | None = None
    step_s: float | None = None
    collectives: dict[Collective, NetModel] = field(default_factory=dict)
    source: str = "profile"
    # One call of the user's optimizer: fixed + per byte (fitted from timed update calls).
    update_fixed_s: float | None = None
    update_per_byte_s: float | None = None
    # Training-thread time per iteration of a lossy compressor (a compressed run's profile).
    compression_s: float | None = None
    # The ranks the optimizer's state and update were divided among (shard_optimizer): step_s
    # is then one rank's updates of its slices.
    update_shards: int = 1

    @property
    def has_module_info(self) -> bool:
        """Overlap mode needs the forward order of modules and each tensor's first user."""
        return bool(self.modules) and any(t.module is not None for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Reader:
    """Small checked accessors; `where` is the path of the field, for the message."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, expected: str, value: Any) -> ProfileError:
        shown = json.dumps(value) if value is not _MISSING else "nothing (the field is missing)"
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return ProfileError(f"profile {self.source}: {where}: expected {expected}, got {shown}")

    def get(self, obj: dict, key: str, where: str, required: bool) -> Any:
        if key in obj:
            return obj[key]
        if required:
            raise self.fail(f"{where}{key}", "a value", _MISSING)
        return None

    def integer(self, obj: dict, key: str, where: str, minimum: int = 0,
                required: bool = True) -> int | None:
        value = self.get(obj, key, where, required)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{where}{key}", f"a whole number >= {minimum}", value)
        return value

    def seconds(self, obj: dict, key: str, where: str) -> float | None:
        """An optional non-negative, finite number of seconds (null or absent: not measured)."""
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise self.fail(f"{where}{key}", "a number of seconds >= 0 or null", value)
        return float(value)

    def text(self, obj: dict, key: str, where: str, nullable: bool = False) -> str | None:
        value = self.get(obj, key, where, required=not nullable)
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where}{key}", "a string" + (" or null" if nullable else ""), value)
        return value


_MISSING = object()


def _tensor(r: _Reader, row: Any, i: int, version: int) -> TensorRecord:
    if not isinstance(row, dict):
        raise r.fail(f"tensors[{i}]", "an object", row)
    name = r.text(row, "name", f"tensors[{i}].")
    where = f"tensors[{i}] ({name!r})."
    tensor_id = r.integer(row, "id", where)
    numel = r.integer(row, "numel", where)
    dtype = r.text(row, "dtype", where)
    forward_index = r.integer(row, "forward_index", where)
    nbytes = r.integer(row, "bytes", where, required=False)
    assert tensor_id is not None and numel is not None and dtype is not None \
        and forward_index is not None and name is not None
    size = ELEMENT_SIZES.get(dtype)
    if size is None:
        # An unknown dtype name is still usable when the byte count tells its size.
        if nbytes is None or numel == 0 or nbytes % numel:
            raise r.fail(f"{where}dtype", "a known dtype (" + ", ".join(sorted(ELEMENT_SIZES))
                         + ") or a 'bytes' field that is a multiple of numel", dtype)
        size = nbytes // numel
    elif nbytes is not None and nbytes != numel * size:
        raise r.fail(f"{where}bytes", f"numel x {size} (element size of {dtype}) = "
                     f"{numel * size}", nbytes)
    # Schema 1 had no `module`: treated as missing, like a profile taken without model=.
    module = r.text(row, "module", where, nullable=True) if version >= 2 else None
    return TensorRecord(tensor_id, name, numel, dtype, size, forward_index,
                        ready_time_s=r.seconds(row, "ready_time_s", where), module=module,
                        shape=_shape(r, row.get("shape"), numel, where))


def _shape(r: _Reader, value: Any, numel: int, where: str) -> tuple[int, ...] | None:
    """The optional `shape` (absent or null: unknown); its product must be numel."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value) \
            or math.prod(value) != numel:
        raise r.fail(f"{where}shape", f"a list of whole numbers whose product is numel ({numel})",
                     value)
    return tuple(value)


def _module(r: _Reader, row: Any, i: int, version: int) -> ModuleRecord:
    if not isinstance(row, dict):
        raise r.fail(f"modules[{i}]", "an object", row)
    name = r.text(row, "name", f"modules[{i}].")
    where = f"modules[{i}] ({name!r})."
    order = r.integer(row, "forward_order", where)
    assert name is not None and order is not None
    self_time = r.seconds(row, "self_time_s", where) if version >= 2 else None
    return ModuleRecord(name, order, r.seconds(row, "forward_time_s", where), self_time)


def _collectives(r: _Reader, value: Any) -> dict[Collective, NetModel]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise r.fail("collectives", "an object keyed by allreduce, reduce_scatter, all_gather",
                     value)
    out = {}
    for op_name, fit in value.items():
        if op_name not in OP_NAMES:
            raise r.fail(f"collectives.{op_name}", "one of the keys " + ", ".join(OP_NAMES),
                         op_name)
        if not isinstance(fit, dict):
            raise r.fail(f"collectives.{op_name}", "an object with alpha_s, beta_s_per_byte", fit)
        alpha = r.seconds(fit, "alpha_s", f"collectives.{op_name}.")
        beta = r.seconds(fit, "beta_s_per_byte", f"collectives.{op_name}.")
        if alpha is None or beta is None:
            missing = "alpha_s" if alpha is None else "beta_s_per_byte"
            raise r.fail(f"collectives.{op_name}.{missing}", "a number >= 0",
                         fit.get(missing, _MISSING))
        out[OP_NAMES[op_name]] = NetModel(alpha, beta)
    return out


def profile_from_document(doc: dict, source: str = "profile") -> RunProfile:
    """Checks a profile document (schema 1 or 2) and returns it as a RunProfile."""
    r = _Reader(source)
    if not isinstance(doc, dict):
        raise r.fail("the document", "a JSON object", doc)
    version = r.integer(doc, "schema_version", "")
    if version not in SCHEMA_VERSIONS:
        raise r.fail("schema_version", " or ".join(map(str, SCHEMA_VERSIONS)), version)
    assert version is not None
    world = r.integer(doc, "world_size", "", minimum=1, required=False)
    rows = doc.get("tensors", _MISSING)
    if not isinstance(rows, list) or not rows:
        raise r.fail("tensors", "a non-empty list of tensor objects", rows)
    tensors = sorted((_tensor(r, row, i, version) for i, row in enumerate(rows)),
                     key=lambda t: t.tensor_id)
    # Ready times and plans index tensors by id, so the ids must be exactly 0..n-1.
    for position, t in enumerate(tensors):
        if t.tensor_id != position:
            raise r.fail(f"tensors ({t.name!r}).id", f"ids 0..{len(tensors) - 1}, each once",
                         t.tensor_id)
    module_rows = doc.get("modules") or []
    if not isinstance(module_rows, list):
        raise r.fail("modules", "a list of module objects", module_rows)
    modules = sorted((_module(r, row, i, version) for i, row in enumerate(module_rows)),
                     key=lambda m: m.forward_order)
    names = {m.name for m in modules}
    for t in tensors:
        if t.module is not None and t.module not in names:
            raise r.fail(f"tensors[{t.tensor_id}] ({t.name!r}).module", "the name of one of "
                         "the modules listed in 'modules'", t.module)
    compute = doc.get("compute") or {}
    if not isinstance(compute, dict):
        raise r.fail("compute", "an object", compute)
    return RunProfile(version, world, tuple(tensors), tuple(modules),
                      r.seconds(compute, "before_first_ready_s", "compute."),
                      r.seconds(compute, "step_s", "compute."),
                      _collectives(r, doc.get("collectives")), source,
                      r.seconds(compute, "update_fixed_s", "compute."),
                      r.seconds(compute, "update_per_byte_s", "compute."),
                      r.seconds(compute, "compression_s", "compute."),
                      r.integer(doc, "update_shards", "", minimum=1, required=False) or 1)


def builtin_path(name: str) -> Path:
    return Path(str(resources.files("commsched.sim").joinpath("builtin", f"{name}.json")))


def read_document(path_or_name: str) -> tuple[dict, str]:
    """The JSON document at a path, or of a built-in profile by name; and a name for messages."""
    path = Path(path_or_name)
    if not path.is_file():
        if path_or_name not in BUILTIN_PROFILES:
            raise ProfileError(f"profile {path_or_name}: no such file, and not a built-in "
                               f"profile ({', '.join(BUILTIN_PROFILES)})")
        path = builtin_path(path_or_name)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ProfileError(f"profile {path_or_name}: cannot read it ({err.strerror})") from None
    try:
        return json.loads(text), path_or_name
    except json.JSONDecodeError as err:
        raise ProfileError(f"profile {path_or_name}: not valid JSON ({err})") from None


def load_profile(path: str | Path) -> RunProfile:
    """A profile from a file, or a built-in one by name (resnet50, vgg16, bert-base)."""
    doc, source = read_document(str(path))
    return profile_from_document(doc, source)


def specs_from_profile(run: RunProfile) -> list[TensorSpec]:
    """The planner's view of the tensors (no Horovod groups: the profile does not record them)."""
    return [TensorSpec(t.tensor_id, t.name, t.numel, t.dtype, t.element_size, t.forward_index)
            for t in run.tensors]


def ready_offsets(run: RunProfile) -> tuple[list[float], list[str]]:
    """Ready time of each tensor from the first gradient, and notes on fallbacks used.

    A tensor never measured counts as ready when the last measured one is (the engine marks
    missing gradients ready as zeros at step()); with nothing measured every gradient is ready
    at once, which is also what the planners assume for an empty profile.
    """
    known = [t.ready_time_s for t in run.tensors if t.ready_time_s is not None]
    if not known:
        return [0.0] * len(run.tensors), ["no ready times in the profile: every gradient is "
                                          "taken as ready at once (backward of zero length)"]
    last = max(known)
    missing = [t.name for t in run.tensors if t.ready_time_s is None]
    notes = [f"{len(missing)} tensors without a ready time are taken as ready at the last "
             f"measured one ({last * 1e3:.3f} ms)"] if missing else []
    return [last if t.ready_time_s is None else t.ready_time_s for t in run.tensors], notes


def ready_profile(run: RunProfile) -> Profile:
    """The planners' Profile: ready times by tensor id, empty when nothing was measured."""
    if all(t.ready_time_s is None for t in run.tensors):
        return Profile()
    return Profile(tuple(ready_offsets(run)[0]))
