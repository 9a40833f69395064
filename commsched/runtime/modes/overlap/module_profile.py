"""The forward order and each module's forward time, recorded by module hooks (the profiling
steps, then the forward passes the profiler samples), that the overlap runner plans its update
groups' places from."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ....torch_compat import eager_hook
from ...engine.profiler import KEEP_ITERATIONS


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
    # modules summed to well over their steady-state time, by varying amounts, over 2-rank
    # profiles of one job at 1 Gbit/s, and a longer sum moves every deadline later, so the floor
    # of one run's profiles spread widely (figures: benchmarks/notes/README.md, 'Module times at
    # steady state'). So the runner also records them in the forward passes
    # the profiler samples under an overlap plan, and a module's time leaves out what the
    # runner's own hooks spent inside it (`excluded_s`: waits for blocks, updates; the profile
    # counts those elsewhere, as before_first_ready_s does).

    # Note [Recomputed forward passes are not timed]
    # Activation checkpointing (torch.utils.checkpoint, a `transformers` model's
    # gradient_checkpointing_enable()) runs the forward of its modules again inside backward,
    # after the root's forward has ended, and their hooks fire again. Timed then, a module's
    # start stayed open until its next real forward pass ended: its time took in the rest of
    # backward, the step and the loop, many times its own (tests/runtime/modes/
    # test_activation_checkpointing.py). Only modules inside the root's own forward pass are
    # timed, and only in a forward pass that records autograd: one under torch.no_grad() or
    # inference_mode() is an evaluation between iterations, at its own batch size.
    #
    # Note [A module called several times]
    # A module may run more than once in one forward pass: torchvision's ResNet blocks call
    # their one `relu` three times, a model with shared layers calls them once per use. Each
    # call is timed from its own start, and a forward pass records the sum of its calls. Timed
    # from the first call's start to each call's end, a ResNet-50 block's `relu` took in the
    # convolutions between its calls: the modules' own times summed to well over the root's,
    # and every later deadline moved (tests/runtime/modes/test_module_times.py). The module keeps
    # the place of its first call in the forward order.

    def __init__(self) -> None:
        self.order: list[str] = []
        self.times: dict[str, list[float]] = {}  # one figure per recorded forward pass
        # Each running call's start and the hooks' excluded time then, by module (a stack: a
        # module may call itself), and the calls' sums in the forward pass so far.
        self._starts: dict[str, list[tuple[float, float]]] = {}
        self._sums: dict[str, float] = {}
        self.excluded_s = 0.0  # the runner's hooks' time in recorded forward passes, summed
        self._in_forward = False  # inside a forward pass (the root's, or the outermost module's)
        # The module whose forward opened the pass in progress: the root, or where the loop
        # calls a module inside `model=` (a container's network, a LightningModule's self.net),
        # the outermost module it calls (Note [The leading group runs at the root]).
        self._pass_root: str | None = None

    def start(self, name: str, root: bool = False) -> None:
        if root or not self._in_forward:
            if not root and torch._C._current_graph_task_id() >= 0:
                return  # Note [Recomputed forward passes are not timed]: inside backward
            self._forget_pass()  # one that raised never reached its end
            self._in_forward = torch.is_grad_enabled()
            if not self._in_forward:
                return
            self._pass_root = name
        self._starts.setdefault(name, []).append((time.perf_counter(), self.excluded_s))
        if name not in self.order:
            self.order.append(name)

    def end(self, name: str) -> None:
        running = self._starts.get(name)
        if running:
            at, excluded = running.pop()
            took = time.perf_counter() - at - (self.excluded_s - excluded)
            # See Note [A module called several times].
            self._sums[name] = self._sums.get(name, 0.0) + took

    def next_iteration(self) -> None:
        """The root's forward pass ended: each module's calls in it make one figure."""
        for name, took in self._sums.items():
            times = self.times.setdefault(name, [])
            times.append(took)
            del times[:-KEEP_ITERATIONS]  # hooks keep recording in long runs: stay bounded
        self._forget_pass()

    def _forget_pass(self) -> None:
        self._starts.clear()
        self._sums.clear()
        self._in_forward = False
        self._pass_root = None

    def attach(self, named: dict[str, torch.nn.Module], root: str) -> list[Any]:
        """Hooks on every module that record one forward pass each (the end of the module that
        opened it closes it); returns their handles."""
        handles = []
        for name, module in named.items():
            handles.append(module.register_forward_pre_hook(
                eager_hook(self._start_hook(name, name == root))))
            handles.append(module.register_forward_hook(eager_hook(self._end_hook(name))))
        return handles

    def _start_hook(self, name: str, root: bool) -> Callable[[torch.nn.Module, Any], None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.start(name, root)
        return hook

    def _end_hook(self, name: str) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.end(name)
            if name == self._pass_root:
                self.next_iteration()
        return hook
