"""Every knob of commsched, declared once, parsed and validated in one place.

Precedence: keyword arguments > ``COMMSCHED_*`` environment variables > the YAML file named by
``COMMSCHED_CONFIG`` > Horovod's own twin variable (``HOROVOD_FUSION_THRESHOLD``,
``HOROVOD_CYCLE_TIME``, ``HOROVOD_TIMELINE``, ``HOROVOD_AUTOTUNE``) > the default. A bad value
raises :class:`ConfigError` naming where it came from, the value, and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "COMMSCHED_"


class ConfigError(ValueError):
    """A knob has a value that is not allowed, or a knob's name is unknown.

    Raised by load_config(), and so by DistributedOptimizer(), init() and everything else that
    reads the knobs, and by ``Compression.powersgd()`` / ``topk()`` for their arguments. The
    message names where the value came from (keyword argument, environment variable, YAML key
    in the file named by COMMSCHED_CONFIG, Horovod's twin variable), the value and what is
    allowed; for a misspelt name or choice it suggests the closest known one. It is a
    ValueError, as Horovod's errors for bad arguments are.
    """


class Policy(enum.StrEnum):
    """The scheduling policies, by the name COMMSCHED_POLICY and ``policy=`` take.

    ``horovod``, ``ddp`` and ``mgwfbp`` are synchronous (step() waits for every gradient);
    ``bytescheduler``, ``prophet`` and ``dear`` overlap iterations (each update is applied in
    the next forward pass, which needs ``model=``); ``auto`` simulates the others and keeps the
    fastest (docs/policies.md). A str enum: ``Policy.DDP == "ddp"``.
    """

    HOROVOD = "horovod"
    DDP = "ddp"
    MGWFBP = "mgwfbp"
    BYTESCHEDULER = "bytescheduler"
    PROPHET = "prophet"
    DEAR = "dear"
    AUTO = "auto"  # simulates the others after profiling and installs the fastest prediction

    @property
    def overlaps_iterations(self) -> bool:
        """Updates are applied in the next forward pass (needs ``model=``)."""
        return self in (Policy.BYTESCHEDULER, Policy.PROPHET, Policy.DEAR)

    @classmethod
    def planned(cls) -> tuple[Policy, ...]:
        """Policies with a planner of their own (`auto` chooses among these)."""
        return tuple(p for p in cls if p is not cls.AUTO)


class Kind(enum.Enum):
    """What sort of value a knob takes; the value is the phrase its errors use."""

    BYTES = "a byte size: an integer or a number with a unit B, KB, MB, GB, KiB, MiB, GiB"
    SECONDS = "a number of seconds"
    MILLISECONDS = "a number of milliseconds"
    COUNT = "a whole number"
    FLOAT = "a number"
    CHOICE = "one of"
    PATH = "a file path (empty for none)"
    FLAG = "a boolean: true/false, 1/0, yes/no or on/off"


@dataclass(frozen=True)
class Knob:
    """One knob's declaration: its name, kind, default, documentation and allowed values."""

    key: str
    kind: Kind
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    horovod_twin: str | None = None
    exclusive_minimum: bool = False
    # What the twin's value means as this knob's, where Horovod's variable says it another way
    # (HOROVOD_AUTOTUNE=1 is policy auto); None: the value as it is. A None result: unset.
    twin_meaning: Callable[[str], Any] | None = None

    @property
    def env(self) -> str:
        """The knob's environment variable, ``COMMSCHED_`` and the key in upper case."""
        return ENV_PREFIX + self.key.upper()

    def allowed(self) -> str:
        """What the knob allows, as its errors say it ("a number of seconds > 0 and <= ...")."""
        if self.kind is Kind.CHOICE:
            return "one of " + ", ".join(self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append(("> " if self.exclusive_minimum else ">= ") + self._bound(self.minimum))
        if self.maximum is not None:
            bounds.append("<= " + self._bound(self.maximum))
        return self.kind.value + (" " + " and ".join(bounds) if bounds else "")

    def _bound(self, value: float) -> str:
        """A byte size's bound in the largest unit the parser takes that divides it.

        So 1024GiB, not 1099511627776.
        """
        if self.kind is Kind.BYTES and value > 0:
            for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
                if value % size == 0:
                    return f"{int(value // size)}{unit}"
        return _fmt(value)


def _autotune_policy(raw: str) -> str | None:
    """HOROVOD_AUTOTUNE as a policy: on is `auto` (commsched's own tuning), off leaves it unset.

    Raises:
        ValueError: the value is no flag (load_config names the variable and what is allowed).
    """
    text = raw.strip().lower()
    if text not in _FLAGS:
        raise ValueError("not a boolean")
    return Policy.AUTO.value if _FLAGS[text] else None


def _horovod_timeline(raw: str) -> str | None:
    """HOROVOD_TIMELINE as the timeline's path, where it names a file.

    Horovod's DYNAMIC (a timeline started later by ``hvd.start_timeline``) names none, and
    leaves the knob unset.
    """
    return None if raw.strip().upper() == "DYNAMIC" else raw


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


MiB = 1 << 20
HOROVOD_FUSION_BYTES = 128 * MiB  # Horovod's HOROVOD_FUSION_THRESHOLD default
DEAR_BUFFER_BYTES = 4 * MiB
COMPRESSION_CHOICES = ("none", "fp16", "bf16", "powersgd", "topk")
KNOBS: tuple[Knob, ...] = (
    Knob("policy", Kind.CHOICE, Policy.HOROVOD.value, "Scheduling policy; HOROVOD_AUTOTUNE=1 "
         "stands for `auto`.", choices=tuple(p.value for p in Policy),
         horovod_twin="HOROVOD_AUTOTUNE", twin_meaning=_autotune_policy),
    Knob("timeout", Kind.SECONDS, 300.0, "Limit of every wait (collectives, bootstrap, flush); "
         "its error names the blocks and tensors that were not ready.", minimum=0,
         exclusive_minimum=True, maximum=7 * 24 * 3600),
    Knob("backend", Kind.CHOICE, "auto", "Backend of the process groups of a world commsched "
         "forms: `nccl` (CUDA tensors), `gloo` (CPU tensors); `auto`: `nccl` where CUDA and "
         "NCCL are available, else `gloo`. A group you made before init() keeps its own.",
         choices=("auto", "nccl", "gloo")),
    Knob("stall_warning", Kind.SECONDS, None, "Rank 0 warns which ranks are behind and how (the "
         "gradients ready on some ranks and missing on them, or the phase they are stuck in) once "
         "a rank has waited this long (0: never); unset: a fifth of `timeout`, so that the "
         "warning comes before the timeout's error.", minimum=0, maximum=7 * 24 * 3600),
    Knob("fusion_threshold", Kind.BYTES, None, "`horovod`, `mgwfbp`: most bytes fused "
         "into one collective (0 disables fusion); `dear`: most bytes of one reduce-scatter "
         "buffer. Unset: 128MiB for `horovod` and `mgwfbp` (Horovod's), 4MiB for `dear`.",
         minimum=0, maximum=1 << 40, horovod_twin="HOROVOD_FUSION_THRESHOLD"),
    Knob("cycle_time", Kind.MILLISECONDS, 1.0, "`horovod` policy: tensors that become ready within "
         "one cycle are fused together.", minimum=0, maximum=60_000,
         horovod_twin="HOROVOD_CYCLE_TIME"),
    Knob("bucket_bytes", Kind.BYTES, 25 * MiB, "`ddp` policy: bucket capacity.", minimum=1,
         maximum=1 << 40),
    Knob("first_bucket_bytes", Kind.BYTES, 1 * MiB, "`ddp` policy: capacity of the first bucket.",
         minimum=1, maximum=1 << 40),
    Knob("profile_steps", Kind.COUNT, 5, "Steps run with one collective per tensor, one in "
         "flight at a time, while the profiler records ready times and collective timings; the "
         "policy's plan is built after them (`ddp` rebuilds after its first step instead).",
         minimum=0, maximum=10_000),
    Knob("refine_steps", Kind.COUNT, 10, "Steps of the policy's own plan (`auto`: of the plan it "
         "keeps), every one profiled, after which it is planned once more from them; fewer "
         "settle sooner on a plan made from fewer iterations.", minimum=1, maximum=10_000),
    Knob("auto_trials", Kind.COUNT, 2, "`auto`: after its choice has run 20 steps, this many "
         "runners-up of other policies (predicted within 15% of it, one per schedule) and the "
         "choice (with the best synchronous plan when the choice overlaps iterations, and the "
         "synchronous plan with the fewest blocks when predicted within 30%, and one other knob "
         "setting of a measured policy predicted within 2% of it) run six "
         "interleaved windows of 10 steps each, and the measured-fastest stays (0: the "
         "prediction alone decides, as always in a world of one).", minimum=0, maximum=16),
    Knob("alpha", Kind.SECONDS, None, "`mgwfbp` policy: start-up latency of one collective; unset: "
         "fitted from the profiled collectives.", minimum=0, maximum=10),
    Knob("beta", Kind.SECONDS, None, "`mgwfbp` policy: seconds per byte of one collective; unset: "
         "fitted from the profiled collectives.", minimum=0, maximum=1),
    Knob("partition_bytes", Kind.BYTES, 4 * MiB, "`bytescheduler`, `prophet`: tensors are split "
         "into partitions of at most this many bytes.", minimum=1, maximum=1 << 40),
    Knob("credit_bytes", Kind.BYTES, 16 * MiB, "Most bytes of collectives in flight at once "
         "(0: no limit); one block is always allowed.", minimum=0, maximum=1 << 40),
    Knob("profile", Kind.PATH, "", "Write the profile (ready times, module forward times, fitted "
         "alpha/beta per collective) as JSON to this path (rank 0)."),
    Knob("timeline", Kind.PATH, "", "Chrome-trace JSON per rank (`{rank}` in the path is replaced, "
         "else `.rank<N>` is inserted before the extension).", horovod_twin="HOROVOD_TIMELINE",
         twin_meaning=_horovod_timeline),
    Knob("compression", Kind.CHOICE, "none", "Gradient compression when "
         "DistributedOptimizer's `compression=` is not given: a cast on the wire (`fp16`, `bf16`) "
         "or a lossy compressor with error feedback (`powersgd`, `topk`; docs/compression.md).",
         choices=COMPRESSION_CHOICES),
    Knob("powersgd_rank", Kind.COUNT, 1, "`powersgd`: rank of the P/Q factors.", minimum=1,
         maximum=1024),
    Knob("powersgd_start_step", Kind.COUNT, 0, "`powersgd`: iterations exchanged uncompressed "
         "before compression starts (a warm-up).", minimum=0, maximum=1 << 31),
    Knob("powersgd_min_ratio", Kind.FLOAT, 2.0, "`powersgd`: a tensor is compressed only if its "
         "factors are at least this many times smaller than it (1-D tensors never are).",
         minimum=1, maximum=1 << 20),
    Knob("shard_optimizer", Kind.FLAG, False, "Each rank keeps the optimizer state of the slices "
         "of the parameters it owns only: gradients are reduce-scattered, owners step, the "
         "updated parameters are all-gathered (ZeRO stage 1, docs/sharding.md). Synchronous "
         "policies and `dear`; element-wise torch.optim optimizers."),
    Knob("uneven_inputs", Kind.FLAG, False, "Each iteration first tells the other ranks whether "
         "this one still has a batch (one small all-reduce), so that a rank out of batches can "
         "call `commsched.join()` and answer their collectives until every rank is done "
         "(`commsched.Join` does the same for a block without it)."),
    Knob("topk_ratio", Kind.FLOAT, 0.01, "`topk`: share of each compressed tensor's entries sent "
         "(the largest in magnitude).", minimum=0, exclusive_minimum=True, maximum=1),
    Knob("topk_start_step", Kind.COUNT, 0, "`topk`: iterations exchanged uncompressed first (a "
         "warm-up; DGC's velocities then continue from SGD's momentum).", minimum=0,
         maximum=1 << 31),
    Knob("topk_warmup_steps", Kind.COUNT, 0, "`topk`: iterations after the start step over "
         "which the share sent falls from 25% to the ratio, by 4x per stage (DGC's warm-up).",
         minimum=0, maximum=1 << 31),
)
KNOBS_BY_KEY = {k.key: k for k in KNOBS}
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# Read by the project's scripts, not by commsched: exported for scripts/setup.sh, they must not
# make every later commsched process refuse to start.
SCRIPT_ENV = (ENV_PREFIX + "VENV",)


@dataclass(frozen=True)
class Config:
    """Every knob's resolved value, by its key (the README's knobs table says what each does)."""

    policy: Policy
    timeout: float
    stall_warning: float
    fusion_threshold: int | None  # None: the policy's own (fusion_bytes)
    cycle_time: float
    bucket_bytes: int
    first_bucket_bytes: int
    profile_steps: int
    alpha: float | None
    beta: float | None
    partition_bytes: int
    credit_bytes: int
    profile: str
    timeline: str
    compression: str = "none"
    powersgd_rank: int = 1
    powersgd_start_step: int = 0
    powersgd_min_ratio: float = 2.0
    topk_ratio: float = 0.01
    topk_start_step: int = 0
    topk_warmup_steps: int = 0
    auto_trials: int = 2
    shard_optimizer: bool = False
    refine_steps: int = 10
    backend: str = "auto"
    uneven_inputs: bool = False

    def fusion_bytes(self, policy: Policy) -> int:
        """`policy`'s fusion threshold: the knob's value, or the policy's own where it is unset.

        Horovod's 128 MiB; DeAR's buffers of 4 MiB, whose all-gathers overlap the next forward
        pass layer by layer rather than in one collective.
        """
        if self.fusion_threshold is not None:
            return self.fusion_threshold
        return DEAR_BUFFER_BYTES if policy is Policy.DEAR else HOROVOD_FUSION_BYTES

    def as_dict(self) -> dict[str, Any]:
        """The knobs as plain values by key (the policy as its name), for logs and checks."""
        out = dataclasses.asdict(self)
        out["policy"] = self.policy.value
        return out


_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10,
          "mib": 1 << 20, "gib": 1 << 30}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip():
        return float(value.strip())
    raise ValueError("not a number")


_FLAGS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}


def _convert(knob: Knob, value: Any) -> Any:
    if knob.kind is Kind.FLAG:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        text = str(value).strip().lower()
        if text not in _FLAGS:
            raise ValueError("not a boolean")
        return _FLAGS[text]
    if knob.kind is Kind.CHOICE:
        text = str(value).strip().lower()
        if text not in knob.choices:
            raise ValueError("unknown choice")
        return Policy(text) if knob.key == "policy" else text
    if knob.kind is Kind.PATH:
        if not isinstance(value, str):
            raise ValueError("not a string")
        return value
    if knob.kind is Kind.BYTES:
        if isinstance(value, bool):
            raise ValueError("a boolean is not a size")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        match = _BYTES_RE.match(str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError("not a byte size")
        amount = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not amount.is_integer():
            raise ValueError("not a whole number of bytes")
        return int(amount)
    if knob.kind is Kind.COUNT:
        number = _number(value)
        if not number.is_integer():
            raise ValueError("not a whole number")
        return int(number)
    number = _number(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return number


def _closest(word: str, options: Sequence[str]) -> str:
    """' (did you mean ...?)' naming the option closest to a misspelt `word`, if one is close."""
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _did_you_mean(knob: Knob, value: Any) -> str:
    """The closest choice to a misspelt one ('bytesheduler'), if one is close."""
    if knob.kind is not Kind.CHOICE:
        return ""
    return _closest(str(value).strip().lower(), knob.choices)


def _unknown(what: str, name: str, known: Sequence[str], label: str = "known") -> str:
    """An unknown knob name's error: the closest known name if one is close, then all of them.

    'COMMSCHED_POLICYY', say, is answered with COMMSCHED_POLICY first.
    """
    return f"{what}{_closest(name, known)}; {label}: " + ", ".join(known)


def parse_value(knob: Knob, value: Any, source: str) -> Any:
    """Converts and range-checks one value; `source` says where it came from for the error."""
    try:
        result = _convert(knob, value)
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"{source}={value!r} is invalid: expected {knob.allowed()}"
                          + _did_you_mean(knob, value)) from None
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        too_low = knob.minimum is not None and (
            result <= knob.minimum if knob.exclusive_minimum else result < knob.minimum)
        too_high = knob.maximum is not None and result > knob.maximum
        if too_low or too_high:
            raise ConfigError(f"{source}={value!r} is out of range: expected {knob.allowed()}")
    return result


PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")


def preset_names() -> list[str]:
    """The presets installed with commsched (one per policy), by the name COMMSCHED_CONFIG takes."""
    return sorted(name[:-len(".yaml")] for name in os.listdir(PRESETS) if name.endswith(".yaml"))


def _preset_path(value: str) -> str:
    """COMMSCHED_CONFIG's file: a path, or the name of an installed preset (``dear``)."""
    if os.path.sep not in value and not os.path.exists(value) and value in preset_names():
        return os.path.join(PRESETS, f"{value}.yaml")
    return value


def _read_yaml(value: str) -> dict[str, Any]:
    import yaml

    path = _preset_path(value)
    if path == value and os.path.sep not in value and not os.path.exists(value):
        raise ConfigError(_unknown(f"{CONFIG_ENV}={value!r}: no such file, and no preset of that "
                                   "name", value, preset_names(), "presets"))
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"{CONFIG_ENV}={path!r}: cannot read the file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{CONFIG_ENV}={path!r}: not valid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{CONFIG_ENV}={path!r}: expected a mapping of knob names to values")
    for key in data:
        if key not in KNOBS_BY_KEY:
            raise ConfigError(_unknown(f"{CONFIG_ENV}={path!r}: unknown key {key!r}", str(key),
                                       list(KNOBS_BY_KEY), "known keys"))
    return data


class Source(enum.Enum):
    """Where a knob's value came from, highest precedence first."""

    ARGUMENT = "keyword argument"
    ENVIRONMENT = "environment variable"
    YAML = "YAML file"
    HOROVOD_TWIN = "Horovod's twin variable"
    DEFAULT = "default"


@dataclass(frozen=True)
class KnobSource:
    """One knob's resolved value and where it came from.

    `where` is the phrase errors use ("environment variable COMMSCHED_POLICY", "YAML key
    'policy' in my.yaml", "default of policy").
    """

    key: str
    value: Any
    source: Source
    where: str


def load_config(overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Resolves every knob by precedence and validates it.

    The precedence: `overrides` (keyword arguments), then ``COMMSCHED_*`` environment
    variables, then the YAML file named by COMMSCHED_CONFIG, then Horovod's twin variables
    (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_TIMELINE, and HOROVOD_AUTOTUNE=1 for
    policy ``auto``), then the default. An empty variable and a
    None value count as unset. DistributedOptimizer calls it with its keyword arguments; call it
    yourself to see what a job will run with (``python -m commsched info`` prints the same with
    each value's source).

    Args:
        overrides: knob values by lower-case key, ahead of every other source (None values
            unset), e.g. ``{"policy": "ddp", "fusion_threshold": "64MiB"}``.
        environ: the environment to read; None reads os.environ.

    Returns:
        Every knob's value, converted (byte sizes to int, the policy to Policy) and checked.

    Raises:
        ConfigError: a value is not allowed, or a key of `overrides`, a ``COMMSCHED_*``
            variable or a YAML key is unknown, or the YAML file cannot be read or parsed.
    """
    values = {key: resolved.value for key, resolved in _resolve(overrides, environ).items()}
    return Config(**values)


def knob_sources(overrides: Mapping[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None) -> dict[str, KnobSource]:
    """Every knob's value, as load_config resolves it, with where it came from.

    Args:
        overrides: keyword arguments, as DistributedOptimizer passes them (None values unset).
        environ: the environment to read; None reads os.environ.

    Returns:
        The knobs in declaration order (KNOBS), by key.

    Raises:
        ConfigError: what load_config raises for the same arguments.
    """
    return _resolve(overrides, environ)


def _resolve(overrides: Mapping[str, Any] | None,
             environ: Mapping[str, str] | None) -> dict[str, KnobSource]:
    """The precedence, in one place: load_config and knob_sources both read it."""
    env = os.environ if environ is None else environ
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key in overrides:
        if key not in KNOBS_BY_KEY:
            raise ConfigError(_unknown(f"unknown keyword argument {key!r}", key,
                                       list(KNOBS_BY_KEY)))
    known_env = {k.env for k in KNOBS} | {CONFIG_ENV} | set(SCRIPT_ENV)
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in known_env:
            raise ConfigError(_unknown(f"unknown environment variable {name}", name,
                                       sorted(known_env)))
    yaml_path = env.get(CONFIG_ENV, "")
    from_yaml = _read_yaml(yaml_path) if yaml_path else {}
    out: dict[str, KnobSource] = {}
    for knob in KNOBS:
        raw, source, where = _pick(knob, overrides, env, from_yaml, yaml_path)
        value = None if source is Source.DEFAULT and raw is None else parse_value(knob, raw, where)
        out[knob.key] = KnobSource(knob.key, value, source, where)
    if out["stall_warning"].value is None:
        out["stall_warning"] = dataclasses.replace(
            out["stall_warning"], value=default_stall_warning(out["timeout"].value))
    return out


def _pick(knob: Knob, overrides: Mapping[str, Any], env: Mapping[str, str],
          from_yaml: Mapping[str, Any], yaml_path: str) -> tuple[Any, Source, str]:
    """A knob's raw value by precedence, its source, and the phrase its error names."""
    if knob.key in overrides:
        return overrides[knob.key], Source.ARGUMENT, f"argument {knob.key}"
    if env.get(knob.env, "") != "":
        return env[knob.env], Source.ENVIRONMENT, f"environment variable {knob.env}"
    if knob.key in from_yaml:
        return from_yaml[knob.key], Source.YAML, f"YAML key {knob.key!r} in {yaml_path}"
    if knob.horovod_twin and env.get(knob.horovod_twin, "") != "":
        raw: Any = env[knob.horovod_twin]
        where = f"environment variable {knob.horovod_twin}"
        if knob.twin_meaning is not None:
            try:
                raw = knob.twin_meaning(raw)
            except ValueError:
                raise ConfigError(f"{where}={raw!r} is invalid: expected {Kind.FLAG.value}"
                                  ) from None
        if raw is not None:
            return raw, Source.HOROVOD_TWIN, where
    return knob.default, Source.DEFAULT, f"default of {knob.key}"


STALL_WARNING_SHARE = 0.2  # of the timeout: 60 s for the default 300 s


def default_stall_warning(timeout: float) -> float:
    """COMMSCHED_STALL_WARNING when unset: a fifth of the timeout.

    So rank 0's warning about a late rank always comes before the error the timeout raises.
    """
    return timeout * STALL_WARNING_SHARE
