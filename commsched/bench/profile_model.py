"""A model that replays a compute profile: a real model's parameters (their count, sizes and
module order) with sleeps in place of its math, so that many ranks at a GPU's pace fit on a few
CPU cores (the cluster testbed, benchmarks/harness/testbed.py).

Note [Replaying a device's compute]
Each replayed module holds the real module's parameters (flattened and divided in size by the
byte scale k) and sleeps the profile's forward time in its forward pass and its backward time in
its backward pass, so backward makes each gradient when the real model's backward would. The
sleeps run to deadlines counted from the start of the pass, as a device runs its queue of
kernels back to back: host work between two modules (a gradient hook, the engine's hand-over)
hides under the device's time as long as the host keeps ahead, and shows once it does not. A
gradient is a fixed pattern per parameter times the sum of the output's gradient, which follows
from the rank's batch: deterministic, and different on every rank, so the average is checked
against torch DDP's. The optimizer's update sleeps its share of the profile's update time
(`sleeping_optimizer`), also for the partial updates an overlap plan makes.

Note [Time dilation]
Many ranks sharing a few cores still spend host time per iteration (Python, autograd, the
collectives' copies) that a GPU host's own cores would spend beside a device's milliseconds. A
replay may therefore run d times slower than the device (`dilate=d`: every compute time d times
as long) with every link d times slower too (the testbed's rate divided by d), which keeps the
ratio of compute to communication, the quantity a schedule trades, while the host's share of
each iteration shrinks d-fold. Per-message latency is the testbed's own, d times smaller against
the dilated iteration than it would be against the real one. Reports state d with k.

Profiles come from a device (`from_device_profile`, the profile a lent GPU wrote) or from a
stated model (`flop_profile`): FLOPs per module counted by torch.utils.flop_counter on the real
model at its full inputs, divided by a stated sustained rate (`GPU_RATES`); backward as twice
the forward's FLOPs; the update as the bytes an SGD step with momentum reads and writes over
the device's memory bandwidth. Modules whose work the counter does not see (normalization,
element-wise activations) get no time of their own.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

PROFILE_PREFIX = "profile:"


@dataclass(frozen=True)
class GpuRate:
    """A named device's sustained rates, and where they come from."""

    name: str
    flops_per_s: float  # sustained dense math
    memory_bytes_per_s: float  # sustained memory bandwidth
    source: str


# Peak figures, as the constants below write them: NVIDIA's H100 Tensor Core GPU datasheet (SXM5:
# dense BF16/FP16 tensor math, HBM3 bandwidth) and its A100 datasheet (SXM4, 80 GB). The
# sustained share is an assumption: 40% of peak math (large-model training reports a model FLOPs
# utilization of 40-55%, e.g. PaLM's, Chowdhery et al. 2022) and 80% of peak bandwidth.
GPU_RATES = {
    "h100-sxm": GpuRate("h100-sxm", 0.40 * 989e12, 0.80 * 3.35e12,
                        "NVIDIA H100 datasheet peaks; 40% of math, 80% of bandwidth assumed"),
    "a100-sxm": GpuRate("a100-sxm", 0.40 * 312e12, 0.80 * 2.04e12,
                        "NVIDIA A100 datasheet peaks; 40% of math, 80% of bandwidth assumed"),
}


@dataclass(frozen=True)
class ModuleCost:
    """One module of the profile: its parameters in forward order, and its times."""

    name: str
    params: list[tuple[str, list[int]]]  # (name, shape)
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class ComputeProfile:
    """What a replay needs of a model's compute on one device (Note [Replaying a device's
    compute])."""

    model: str
    source: str  # where the times come from: a device, or a stated rate
    samples: int  # per rank, per iteration
    modules: list[ModuleCost]
    update_s: float  # the optimizer's step over every parameter

    @property
    def forward_s(self) -> float:
        return sum(m.forward_s for m in self.modules)

    @property
    def backward_s(self) -> float:
        return sum(m.backward_s for m in self.modules)

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for m in self.modules for _, shape in m.params)

    def dilated(self, factor: float) -> ComputeProfile:
        """Every time `factor` times as long (Note [Time dilation])."""
        return dataclasses.replace(
            self, modules=[dataclasses.replace(m, forward_s=m.forward_s * factor,
                                               backward_s=m.backward_s * factor)
                           for m in self.modules], update_s=self.update_s * factor)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ComputeProfile:
        """The profile `to_json` wrote.

        Raises:
            ValueError: a field is missing or a time is negative.
        """
        try:
            modules = [ModuleCost(m["name"], [(n, list(s)) for n, s in m["params"]],
                                  float(m["forward_s"]), float(m["backward_s"]))
                       for m in document["modules"]]
            profile = cls(document["model"], document["source"], int(document["samples"]),
                          modules, float(document["update_s"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a compute profile: missing or malformed {err}") from None
        if any(m.forward_s < 0 or m.backward_s < 0 for m in modules) or profile.update_s < 0:
            raise ValueError(f"compute profile of {profile.model}: a time is negative")
        return profile

    @classmethod
    def read(cls, path: str | Path) -> ComputeProfile:
        with open(path, encoding="utf-8") as handle:
            return cls.from_json(json.load(handle))


def flop_profile(model: nn.Module, inputs: Sequence[torch.Tensor], label: str, samples: int,
                 rate: GpuRate) -> ComputeProfile:
    """The profile of `model` on a device of `rate`, from the FLOPs of one forward pass.

    The model and inputs may be on the meta device: only shapes are read. A module's time is
    the FLOPs of its own operations (those of its children excluded). Work of a module that
    holds no parameter (an attention's products, a root's) is added to the module holding one
    that finished last before it did (the first, when none had), so the total is kept. Modules
    are listed in the order their forward passes finish; a parameter shared by two modules
    belongs to the first.

    Args:
        model: the real model.
        inputs: its forward pass's arguments, at the size it trains on.
        label: the profile's model name.
        samples: the samples in `inputs` (per rank and iteration).
        rate: the device's sustained rates.

    Returns:
        The profile.
    """
    from torch.utils.flop_counter import FlopCounterMode

    order: list[str] = []  # by the end of each module's first forward pass
    names = {module: name for name, module in model.named_modules()}
    handles = [module.register_forward_hook(
        lambda m, args, out: order.append(names[m]) if names[m] not in order else None)
        for module in names]
    try:
        with FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    root = type(model).__name__
    totals = {_relative(key, root): sum(ops.values())
              for key, ops in counter.get_flop_counts().items() if key != "Global"}
    own = {}
    for name in order:
        children = [c for c in totals if c != name and _parent(c) == name]
        own[name] = totals.get(name, 0) - sum(totals[c] for c in children)
    seen: set[int] = set()
    modules: list[ModuleCost] = []
    before_any = 0.0  # FLOPs finished before any module holding a parameter
    for name in order:
        module = model.get_submodule(name) if name else model
        params = [(f"{name}.{n}" if name else n, list(p.shape))
                  for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in module.named_parameters(recurse=False))
        seconds = own.get(name, 0) / rate.flops_per_s
        if params:
            modules.append(ModuleCost(name, params, seconds, 2 * seconds))
        elif modules:
            last = modules[-1]
            modules[-1] = dataclasses.replace(last, forward_s=last.forward_s + seconds,
                                              backward_s=last.backward_s + 2 * seconds)
        else:
            before_any += seconds
    if modules and before_any:
        first = modules[0]
        modules[0] = dataclasses.replace(first, forward_s=first.forward_s + before_any,
                                         backward_s=first.backward_s + 2 * before_any)
    numel = sum(math.prod(s) for m in modules for _, s in m.params)
    # SGD with momentum reads the parameter, its gradient and the buffer and writes two: fp32.
    update_s = 5 * 4 * numel / rate.memory_bytes_per_s
    return ComputeProfile(label, f"FLOPs (torch.utils.flop_counter) at {rate.name}: "
                          f"{rate.flops_per_s / 1e12:.0f} TFLOP/s, "
                          f"{rate.memory_bytes_per_s / 1e12:.2f} TB/s ({rate.source})",
                          samples, modules, update_s)


def _relative(key: str, root: str) -> str:
    """A flop counter's module key ('ResNet.layer1.0') as a name in named_modules()."""
    return "" if key == root else key.removeprefix(root + ".")


def _parent(name: str) -> str | None:
    return None if not name else name.rpartition(".")[0]


# A shorter wait is not slept but left to the next one: a sleep costs the host a system call
# and a wake-up, which many ranks sharing a few cores cannot afford per module.
SHORTEST_SLEEP_S = 0.001


class DeviceQueue:
    """The replayed device's time within a pass (Note [Replaying a device's compute])."""

    def __init__(self) -> None:
        self._deadline = 0.0

    def start(self) -> None:
        """A pass begins: the device is idle now."""
        self._deadline = time.perf_counter()

    def run(self, seconds: float) -> None:
        """Queues `seconds` of work and waits until the device has done it (a wait shorter
        than SHORTEST_SLEEP_S is left to the next call, or to `drain`)."""
        self._deadline += seconds
        wait = self._deadline - time.perf_counter()
        if wait >= SHORTEST_SLEEP_S:
            time.sleep(wait)

    def drain(self) -> None:
        """The pass ends: waits for whatever the device has left."""
        wait = self._deadline - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, unit: ReplayedModule,  # type: ignore[override]
                *params: torch.Tensor) -> torch.Tensor:
        ctx.unit = unit
        unit.queue.run(unit.cost.forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        unit: ReplayedModule = ctx.unit
        if unit.opens_backward:
            unit.queue.start()
        unit.queue.run(unit.cost.backward_s)
        if unit.closes_backward:
            unit.queue.drain()
        return (grad, None, *torch._foreach_mul(unit.patterns, grad.sum()))


class ReplayedModule(nn.Module):
    """One module of a profile: its parameters, k times smaller, and its times."""

    def __init__(self, cost: ModuleCost, scale: int, queue: DeviceQueue,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.cost, self.queue = cost, queue
        self.opens_backward = False  # the last module's backward starts the pass
        self.closes_backward = False  # ... and the first's ends it
        sizes = [max(1, math.ceil(math.prod(shape) / scale)) for _, shape in cost.params]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(n, generator=generator) * 0.02) for n in sizes)
        self.patterns = [torch.randn(n, generator=generator) for n in sizes]
        self._params = tuple(self.weights)  # ParameterList's iteration costs a call per pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Replay.apply(x, self, *self._params)
        return out


def merged(modules: Sequence[ModuleCost], count: int) -> list[ModuleCost]:
    """`modules` as at most `count` runs of neighbours with about equal time each, every
    parameter kept in its order: fewer Python calls per pass for a replay whose many small
    modules would cost the host more than the device's time between them."""
    total = sum(m.forward_s + m.backward_s for m in modules)
    if count >= len(modules) or total == 0:
        return list(modules)
    runs: list[list[ModuleCost]] = [[]]
    spent = 0.0
    for module in modules:
        if runs[-1] and spent >= total * len(runs) / count:
            runs.append([])
        runs[-1].append(module)
        spent += module.forward_s + module.backward_s
    return [ModuleCost(run[0].name if len(run) == 1 else f"{run[0].name}..{run[-1].name}",
                       [param for m in run for param in m.params],
                       sum(m.forward_s for m in run), sum(m.backward_s for m in run))
            for run in runs]


class ProfileModel(nn.Module):
    """A model whose forward and backward replay `profile` (Note [Replaying a device's
    compute]), with every parameter's size divided by `scale` (the byte scale k), its modules
    merged into at most `units` runs when given."""

    def __init__(self, profile: ComputeProfile, scale: int = 1, seed: int = 0,
                 units: int | None = None) -> None:
        super().__init__()
        if scale < 1:
            raise ValueError(f"the byte scale k must be at least 1, not {scale}")
        self.profile, self.scale = profile, scale
        self.queue = DeviceQueue()
        generator = torch.Generator().manual_seed(seed)
        costs = merged(profile.modules, units) if units else profile.modules
        units_ = [ReplayedModule(m, scale, self.queue, generator) for m in costs]
        if units_:
            units_[-1].opens_backward = units_[0].closes_backward = True
        self.units = nn.ModuleList(units_)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.queue.start()
        for unit in self.units:
            x = unit(x)
        self.queue.drain()
        return x


def sleeping_optimizer(base: type[torch.optim.Optimizer], update_s: float,
                       numel: int) -> type[torch.optim.Optimizer]:
    """`base` whose step also sleeps `update_s` times the share of `numel` elements it steps:
    the replayed device's update, whole or in an overlap plan's groups. A share shorter than
    SHORTEST_SLEEP_S is slept with a later step's. Where `base` takes `foreach`, it steps every
    tensor of a group in one call by default, as it does on a GPU."""
    per_element = update_s / max(numel, 1)
    owed = [0.0]  # seconds of update not slept yet, by every instance of the class

    def init(self: torch.optim.Optimizer, params: Any, *args: Any, **kwargs: Any) -> None:
        if "foreach" in inspect.signature(base.__init__).parameters:
            kwargs.setdefault("foreach", True)
        base.__init__(self, params, *args, **kwargs)

    def step(self: torch.optim.Optimizer, closure: Callable[[], float] | None = None) -> Any:
        owed[0] += per_element * sum(p.numel() for g in self.param_groups for p in g["params"])
        if owed[0] >= SHORTEST_SLEEP_S:
            time.sleep(owed[0])
            owed[0] = 0.0
        return base.step(self, closure)

    return type(f"Replayed{base.__name__}", (base,), {"__init__": init, "step": step})


def replay_batch(batch_size: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The replay's input and target: small, and different per step and rank."""
    generator = torch.Generator().manual_seed(10_000 * rank + step)
    return (torch.randn(batch_size, 4, generator=generator),
            torch.randn(batch_size, 4, generator=generator))


def replay_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output * target).mean()


@dataclass(frozen=True)
class ProfileSpec:
    """A replayed model named as ``profile:<path to a profile JSON>?k=<byte scale>&units=<n>&
    dilate=<d>`` (units: at most n replayed modules, `merged`; d: Note [Time dilation])."""

    value: str  # the text it was parsed from, as reports name the model
    path: str
    scale: int  # the byte scale k
    units: int | None = None
    dilation: int = 1

    @classmethod
    def parse(cls, text: str) -> ProfileSpec:
        """Reads a spec.

        Args:
            text: ``profile:PATH``, optionally with ``?k=N&units=M&dilate=D``.

        Returns:
            The spec.

        Raises:
            ValueError: not such a spec, a knob other than k, units and dilate, one below 1, or
                a file that is not a compute profile.
        """
        if not text.startswith(PROFILE_PREFIX):
            raise ValueError(f"{text!r} is not {PROFILE_PREFIX}<path>?k=<byte scale>")
        path, _, query = text.removeprefix(PROFILE_PREFIX).partition("?")
        knobs: dict[str, int] = {}
        for item in filter(None, query.split("&")):
            key, _, number = item.partition("=")
            if key not in ("k", "units", "dilate") or not number.isdigit() or int(number) < 1:
                raise ValueError(f"{text!r}: the settings are k=<byte scale>, units=<replayed "
                                 f"modules> and dilate=<time dilation>, each an integer >= 1, "
                                 f"not {item!r}")
            knobs[key] = int(number)
        try:
            ComputeProfile.read(path)
        except OSError as err:
            raise ValueError(f"{text!r}: cannot read the profile: {err}") from None
        return cls(text, path, knobs.get("k", 1), knobs.get("units"), knobs.get("dilate", 1))

    def build(self, seed: int = 0) -> ProfileModel:
        profile = ComputeProfile.read(self.path).dilated(self.dilation)
        return ProfileModel(profile, self.scale, seed, self.units)
