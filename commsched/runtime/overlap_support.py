"""What the overlap runner stands on besides its plan: the forward order and each module's
forward time, recorded by module hooks (the profiling steps, then sampled iterations), and
whether a wrapped optimizer and model can run an overlap plan at all."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .profiler import KEEP_ITERATIONS


class ModuleProfile:
    """Forward order and per-module forward time (seconds), from module hooks: every forward pass
    of the profiling steps, then the sampled ones of an overlap plan (Note [Module times at
    steady state])."""

    # Note [Module times at steady state]
    # The simulator and the floor (sim/floor.py) place each update's deadline at the forward
    # time spent before the module that first uses it, so module times must describe the
    # iterations the rest of the profile describes: the latest ones (ready times, compute and
    # collectives are the latest half of the sampled iterations, or the settled plan's, and
    # module times the latest half of theirs). Recorded only in the profiling
    # steps, they were warm-up figures that varied from run to run: the built-in Transformer's
    # modules summed to 61-92 ms over 2-rank profiles of one job at 1 Gbit/s (53 ms alone at
    # steady state), and a longer sum moves every deadline later, so the floor of one run's
    # profiles spread over 316-350 ms. So the runner also records them in the forward passes
    # the profiler samples under an overlap plan, and a module's time leaves out what the
    # runner's own hooks spent inside it (`excluded_s`: waits for blocks, updates; the profile
    # counts those elsewhere, as before_first_ready_s does).

    def __init__(self) -> None:
        self.order: list[str] = []
        self.times: dict[str, list[float]] = {}
        self._starts: dict[str, tuple[float, float]] = {}
        self.excluded_s = 0.0  # the runner's hooks' time in recorded forward passes, summed

    def start(self, name: str) -> None:
        if name not in self._starts:
            self._starts[name] = (time.perf_counter(), self.excluded_s)
            if name not in self.order:
                self.order.append(name)

    def end(self, name: str) -> None:
        started = self._starts.get(name)
        if started is not None:
            at, excluded = started
            times = self.times.setdefault(name, [])
            times.append(time.perf_counter() - at - (self.excluded_s - excluded))
            del times[:-KEEP_ITERATIONS]  # hooks keep recording in long runs: stay bounded

    def next_iteration(self) -> None:
        self._starts.clear()

    def attach(self, named: dict[str, torch.nn.Module], root: str) -> list[Any]:
        """Hooks on every module that record one forward pass each (the root's end closes it);
        returns their handles."""
        handles = []
        for name, module in named.items():
            handles.append(module.register_forward_pre_hook(self._start_hook(name)))
            handles.append(module.register_forward_hook(self._end_hook(name, name == root)))
        return handles

    def _start_hook(self, name: str) -> Callable[[torch.nn.Module, Any], None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.start(name)
        return hook

    def _end_hook(self, name: str, root: bool) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.end(name)
            if root:
                self.next_iteration()
        return hook


# Optimizers whose step needs every gradient at once: they cannot be split into per-block updates.
_UNSPLITTABLE = (torch.optim.LBFGS,)


def overlap_possible(model: Any, base_cls: type) -> bool:
    return isinstance(model, torch.nn.Module) and not issubclass(base_cls, _UNSPLITTABLE)


def check_overlap_allowed(policy_name: str, model: Any, base_cls: type) -> None:
    if model is None or not isinstance(model, torch.nn.Module):
        raise ValueError(f"commsched: policy '{policy_name}' applies each update in the next "
                         "forward pass and needs the model: DistributedOptimizer(..., model=model)")
    if issubclass(base_cls, _UNSPLITTABLE):
        raise ValueError(f"commsched: {base_cls.__name__} needs all gradients at once and cannot "
                         f"be split into per-block updates as policy '{policy_name}' does; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous)")
