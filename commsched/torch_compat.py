"""Every difference between the torch versions commsched supports, in one place.

Supported: torch MIN_TORCH (2.4) up to every patch release of MAX_TESTED_TORCH (2.15), CPU and
CUDA builds. scripts/setup.sh reads the range from this file (without importing commsched) and
refuses a torch outside it; scripts/check_torch_compat.sh builds and tests on the oldest one.
The C++ side has its own single place, csrc/torch_compat.h.

Differences bridged here (torch version that changed it):

* 2.13: ``DistributedDataParallel(broadcast_buffers=...)`` became ``forward_sync_buffers=...``;
  the old argument warns from 2.13 on and older torch lacks the new one: `ddp_kwargs`.
* every version: torch wraps each optimizer class's ``step`` in a function that opens a profiler
  range and runs the step hooks, marked ``hooked`` with the original as ``__wrapped__``:
  `unhooked_step` (a call from inside an already wrapped ``step`` must not run them again).
* 2.0 on: ``GradScaler.step`` hands an optimizer that claims ``_step_supports_amp_scaling``
  its scale and overflow flag as the attributes ``grad_scale`` and ``found_inf`` (the older
  ``grad_scaler=`` keyword is deprecated): `unscale_grads_` unscales as the scaler's own
  ``unscale_`` does, bit for bit.
* every version: dynamo does not guard on module hooks unless ``skip_nnmodule_hook_guards`` is
  off, and an overlap plan adds and removes them: `guard_module_hooks`.
* 2.11: Gloo's worker threads are named ``pt_gloo_runloop``; before, they carry the name of the
  thread that imported torch: `GLOO_WORKER_THREAD_NAME`.

A base layer module: imports only torch and the standard library.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

MIN_TORCH = "2.4"
MAX_TESTED_TORCH = "2.15"


def parse_version(text: str) -> tuple[int, int, int]:
    """'2.13.0+cpu' -> (2, 13, 0); '2.15.0a0+git1234' -> (2, 15, 0); '2.4' -> (2, 4, 0).
    A local suffix (+cpu, +cu130) or a pre-release tag does not change the result."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _minor(text: str) -> tuple[int, int]:
    major, minor, _ = parse_version(text)
    return major, minor


TORCH_VERSION: tuple[int, int, int] = parse_version(torch.__version__)


def at_least(major: int, minor: int) -> bool:
    """True when the installed torch is major.minor or newer."""
    return TORCH_VERSION[:2] >= (major, minor)


def is_supported(version: str) -> bool:
    """Whether a torch version string lies in [MIN_TORCH, MAX_TESTED_TORCH.x]."""
    return _minor(MIN_TORCH) <= _minor(version) <= _minor(MAX_TESTED_TORCH)


def supported_range() -> str:
    return f"{MIN_TORCH} to {MAX_TESTED_TORCH}.x"


def unhooked_step(cls: type[torch.optim.Optimizer]) -> Any:
    """`cls`'s ``step`` without torch's wrapper (profiler range, step pre/post hooks): for calls
    made from inside a step() that already ran them once."""
    step = cls.step
    return getattr(step, "__wrapped__", step) if getattr(step, "hooked", False) else step


def ddp_kwargs(*, sync_buffers: bool) -> dict[str, Any]:
    """DistributedDataParallel's keyword for syncing buffers at every forward. Before 2.13,
    ``broadcast_buffers=False`` also skips the buffer broadcast at construction, which
    ``forward_sync_buffers=False`` still does; ranks that build their model the same way hold
    the same buffers anyway."""
    if at_least(2, 13):
        return {"forward_sync_buffers": sync_buffers}
    return {"broadcast_buffers": sync_buffers}


# The name Gloo's worker threads carry in /proc/<pid>/task/*/comm; None where torch leaves them
# unnamed (they then share their name with other threads and cannot be told apart by it).
GLOO_WORKER_THREAD_NAME: str | None = "pt_gloo_runloop" if at_least(2, 11) else None


def reduce_scatter_single(output: torch.Tensor, tensor: torch.Tensor, group: Any) -> None:
    """torch.distributed's flat reduce-scatter (sum): named reduce_scatter_single since 2.13,
    reduce_scatter_tensor before (kept as a deprecated alias that warns)."""
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output, tensor, group=group)


def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, group: Any) -> None:
    """torch.distributed's flat all-gather: all_gather_single since 2.13, all_gather_into_tensor
    before."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, tensor, group=group)


def unscale_grads_(params: list[torch.Tensor], grad_scale: torch.Tensor) -> None:
    """Divides every gradient of `params` by `grad_scale` in place, exactly as
    ``GradScaler.unscale_`` does (the same inverse, computed in float64 and rounded to float32,
    and the same fused kernel per device and dtype), so that a step unscaled here equals one
    unscaled by the scaler. Non-finite entries are left as they are (the caller skips such a
    step)."""
    inverse = grad_scale.double().reciprocal().float()
    grouped: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if grad.is_sparse:
            if grad.dtype is torch.float16:  # duplicates could overflow once summed
                param.grad = grad = grad.coalesce()
            grad = grad._values()
        grouped.setdefault((grad.device, grad.dtype), []).append(grad)
    for (device, _), grads in grouped.items():
        ignored = torch.zeros((), dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, ignored, inverse.to(device))


def eager_hook(hook: Any) -> Any:
    """`hook` run eagerly when a module it is registered on runs inside ``torch.compile``:
    dynamo would otherwise trace into it (an optimizer step, clocks, the engine's waits) and
    fail or bake them into the graph; instead the graph breaks at the call (Note [Module hooks
    under torch.compile] in runtime/modes/overlap/runner.py)."""
    return torch.compiler.disable(hook, recursive=True)


_hooks_guarded = False  # whether guard_module_hooks() has set dynamo's switch in this process


def guard_module_hooks() -> None:
    """Makes torch.compile re-trace a graph when a module's forward hooks come or go.

    By default dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``): a graph
    traced while a module had none is run again after an overlap plan hooked it, and its updates
    are skipped (Note [No forward pass on a pending update] in runtime/modes/overlap/guard.py). This
    turns the guards on, once per process, where dynamo is loaded; graphs traced before without
    them are dropped (``torch._dynamo.reset()``: they re-trace at their next call). Where dynamo
    is not loaded yet nothing was traced: the next call (the runner's next hook change) sets it.
    """
    global _hooks_guarded
    if _hooks_guarded or "torch._dynamo" not in sys.modules:
        return
    import torch._dynamo

    config = torch._dynamo.config
    if getattr(config, "skip_nnmodule_hook_guards", False):
        config.skip_nnmodule_hook_guards = False
        if torch._dynamo.utils.counters["frames"].get("ok", 0):
            torch._dynamo.reset()
    _hooks_guarded = True


def compiled_fullgraph(module: Any) -> bool:
    """Whether `module` is ``torch.compile(m, fullgraph=True)``'s result, or a module compiled in
    place with ``m.compile(fullgraph=True)``. The flag sits on dynamo's context object, whose
    attributes differ between versions: where none is found, False (a graph break then fails at
    the first forward pass, in dynamo's own words)."""
    owners = [getattr(module, "dynamo_ctx", None)]
    compiled_call = getattr(module, "_compiled_call_impl", None)
    if compiled_call is not None:  # the context and its callback are in the wrapper's closure
        owners += [cell.cell_contents for cell in getattr(compiled_call, "__closure__", None) or ()]
    owners += [getattr(owner, "callback", None) for owner in owners]
    for owner in owners:
        for name in ("fullgraph", "_one_graph"):
            value = getattr(owner, name, None)
            if isinstance(value, bool):
                return value
    return False
