"""What the overlap runner stands on besides its plan: the forward order and each module's
forward time, recorded by module hooks during the profiling steps, and whether a wrapped
optimizer and model can run an overlap plan at all."""

from __future__ import annotations

import time
from typing import Any

import torch

from .profiler import KEEP_ITERATIONS


class ModuleProfile:
    """Forward order and per-module forward time (seconds), from module hooks."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.times: dict[str, list[float]] = {}
        self._starts: dict[str, float] = {}

    def start(self, name: str) -> None:
        if name not in self._starts:
            self._starts[name] = time.perf_counter()
            if name not in self.order:
                self.order.append(name)

    def end(self, name: str) -> None:
        started = self._starts.get(name)
        if started is not None:
            times = self.times.setdefault(name, [])
            times.append(time.perf_counter() - started)
            del times[:-KEEP_ITERATIONS]  # hooks keep recording in long runs: stay bounded

    def next_iteration(self) -> None:
        self._starts.clear()


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
