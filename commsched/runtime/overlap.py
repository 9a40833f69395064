"""Cross-iteration overlap: ``step()`` returns while gradients are still on the wire; each
parameter's update is applied in the forward pre-hook of the first module that uses it in the
next iteration, just before that module runs.

Timeline of one iteration (after the profiling steps):
    backward: hooks hand gradients to the engine, which launches the plan's backward blocks
    step():   the rest is launched; gradients are taken from ``p.grad`` (the engine owns them);
              hyper-parameters are snapshotted; for DeAR the first all-gather is released
    forward:  pre-hook of module m: release the all-gathers up to the one m needs plus one
              (look-ahead), wait for the blocks m's parameters are in, apply their update with
              the user's optimizer restricted to them
    end of the root module's forward: wait for everything, apply what is left (parameters not
              used in this forward), and the engine is ready for the next backward
During the profiling steps the same hooks record the forward order and each module's time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _C
from ..plan import Collective, Plan, Stage
from .deferred import DeferredUpdates
from .profiler import KEEP_ITERATIONS

if TYPE_CHECKING:
    from .engine import EngineHandle


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


class OverlapRunner:
    def __init__(self, deferred: DeferredUpdates, model: nn.Module, params: list[torch.Tensor],
                 engine: EngineHandle) -> None:
        self._deferred = deferred
        self._engine = engine
        self._params = params
        self._tid = {id(p): i for i, p in enumerate(params)}
        self.modules = ModuleProfile()
        self._named = dict(model.named_modules())
        self._owned = {name: [self._tid[id(p)] for p in m.parameters(recurse=False) if id(p) in self._tid]
                       for name, m in self._named.items()}
        self.active = False
        self.recording = True  # module order and times, while no overlap plan is active
        self._update_us = 0
        self.open = False
        self._pending: set[int] = set()
        self._grads: dict[int, torch.Tensor] = {}
        self._first_user: dict[str, list[int]] = {}
        self._needs: dict[int, int] = {}
        self._gathers: list[int] = []
        self._released = 0
        self._handles = []
        for name, module in self._named.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook_for(name)))
            self._handles.append(module.register_forward_hook(self._post_hook_for(name)))
        self._root_name = ""

    # -- activation -------------------------------------------------------------------------

    def _runner_of(self, name: str) -> str:
        """The module whose pre-hook must apply `name`'s parameters: `name` itself if its forward
        ran, else its nearest ancestor that ran (nn.MultiheadAttention reads
        ``out_proj.weight`` without calling ``out_proj``), else the root."""
        ran = set(self.modules.order)
        while name and name not in ran:
            name = name.rpartition(".")[0]
        return name

    def first_users(self) -> dict[int, str]:
        """Tensor id -> the module (observed forward order) whose pre-hook applies its update."""
        rank = {name: i for i, name in enumerate(self.modules.order)}
        earliest: dict[int, str] = {}
        for owner, tids in self._owned.items():
            runner = self._runner_of(owner)
            for t in tids:
                current = earliest.get(t)
                if current is None or rank.get(runner, -1) < rank.get(current, -1):
                    earliest[t] = runner
        return earliest

    def activate(self, plan: Plan) -> None:
        """Maps each parameter to the first module (in observed forward order) that uses it, and
        to the last plan position it has to wait for."""
        first_user: dict[str, list[int]] = {}
        for t, runner in self.first_users().items():
            first_user.setdefault(runner, []).append(t)
        self._first_user = {name: sorted(tids) for name, tids in first_user.items()}
        completing = Collective.ALL_GATHER if any(b.op is Collective.ALL_GATHER for b in plan.blocks) \
            else Collective.ALLREDUCE
        self._needs = {}
        for position, block in enumerate(plan.blocks):
            if block.op is completing:
                for piece in block.pieces:
                    self._needs[piece.tensor_id] = position
        self._gathers = [i for i, b in enumerate(plan.blocks) if b.stage is Stage.FORWARD]
        self.active = True

    def restore(self, order: list[str], active: bool, recording: bool, plan: Plan) -> None:
        """Puts the runner where a checkpoint left it. The forward order decides in which
        module's pre-hook each update runs; without it an activated runner would apply every
        update before the first layer (correct, but no overlap)."""
        self.modules.order = list(order)
        if active:
            self.activate(plan)
        self.active = active
        self.recording = recording

    def take_update_seconds(self) -> float:
        """Time spent applying updates since the last call (the profiler's step_s)."""
        seconds, self._update_us = self._update_us / 1e6, 0
        return seconds

    def deactivate(self) -> None:
        """A synchronous plan replaced the overlap one (`auto`): hooks stop doing anything."""
        self.active = False
        self.recording = False

    # -- step ---------------------------------------------------------------------------------

    def begin(self) -> None:
        """Called by step(): everything is launched; the updates wait for the next forward."""
        self._deferred.snapshot()
        for tid, p in enumerate(self._params):
            if tid in self._needs:
                self._grads[tid] = p.grad  # type: ignore[assignment]
                p.grad = None
        self._pending = set(self._grads)
        self.open = True
        self._released = 0
        self._release_through(0)

    def _release_through(self, count: int) -> None:
        while self._released < min(count + 1, len(self._gathers)):
            self._engine.release(self._gathers[self._released])
            self._released += 1

    def finish(self) -> None:
        """Waits for every block of the open iteration and applies every pending update."""
        if not self.open:
            return
        self._release_through(len(self._gathers))
        self._engine.wait()
        self._apply(sorted(self._pending))
        self._grads.clear()
        self.open = False

    def _apply(self, tids: list[int]) -> None:
        if not tids:
            return
        started = _C.now_us()
        self._deferred.apply([self._params[t] for t in tids], [self._grads[t] for t in tids])
        self._update_us += _C.now_us() - started
        self._engine.span("update", started, tensors=len(tids))
        self._pending.difference_update(tids)

    # -- module hooks -------------------------------------------------------------------------

    def _pre_hook_for(self, name: str):  # noqa: ANN202 - torch hook
        def hook(module: nn.Module, args: Any) -> None:
            if not self.active:
                if self.recording:
                    self.modules.start(name)
                return
            if not self.open:
                return
            tids = [t for t in self._first_user.get(name, ()) if t in self._pending]
            if not tids:
                return
            need = max(self._needs[t] for t in tids)
            if self._gathers:
                self._release_through(self._gathers.index(need) + 1)
            self._engine.wait_block(need)
            self._apply(tids)
        return hook

    def _post_hook_for(self, name: str):  # noqa: ANN202 - torch hook
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.active:
                if not self.recording:
                    return
                self.modules.end(name)
                if name == self._root_name:
                    self.modules.next_iteration()
            elif name == self._root_name:
                self.finish()
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


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
