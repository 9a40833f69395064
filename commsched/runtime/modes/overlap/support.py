"""What the overlap runner stands on besides its plan: the forward order and each module's
forward time, recorded by module hooks (the profiling steps, then sampled iterations), which
modules' pre-hooks apply which update groups, what reads the model whole before its deferred
updates are applied, and whether a wrapped optimizer and model can run an overlap plan at all."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ....plan import UpdateGroup
from ....torch_compat import compiled_fullgraph, eager_hook
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


# Optimizers whose step needs every gradient at once: they cannot be split into per-block updates.
_UNSPLITTABLE = (torch.optim.LBFGS,)


# Note [Skipped group starts]
# A group is applied in the pre-hook of its first module, but control flow may skip that module
# in some iteration (a branch taken on even steps only, an expert that got no tokens) while a
# later module of the same group runs: it would then compute with the old parameters, and the
# update applied at the end of forward would change tensors its backward still needs. So the
# first user of every parameter of a group also applies the group if it is still pending; when
# the start ran, that costs one lookup.
#
# Note [The leading group runs at the root]
# The group that starts at the first module of the forward pass to use any parameter is applied
# in the root module's pre-hook instead: no module before that one reads a parameter, so the
# update still comes before its first use and the forward pass hides no less of its wait; and
# the root runs in every forward pass that ran it in the profiling steps, so that group needs no
# first-user hooks. With one group (a world of one, or nothing to overlap) only the root keeps
# hooks: each hooked module costs a Python call and torch's slow module-call path per forward
# pass (22 modules of the built-in Transformer, about 75 of GPT-2). But `model=` need not be
# what the loop calls: a container whose inner network the loop calls, a LightningModule whose
# training_step calls self.net, an fx GraphModule of the model. Its root then never ran in the
# recorded forward passes (it is not in `order`), and the leading group keeps the hooks of its
# own modules, as every other group does.
def hook_places(groups: Sequence[UpdateGroup], first_user: dict[int, str], order: list[str],
                modules: set[str], root: str) -> dict[str, list[int]]:
    """Module name -> the indices of the groups its forward pre-hook applies when pending: each
    group at its start and at the first user of each of its tensors (`first_user`: tensor id ->
    module), the leading group at the root where the root ran in `order`, and a name not among
    `modules` at the root too."""
    users_now = set(first_user.values())
    leading = next((name for name in order if name in users_now), None) \
        if root in order else None
    places: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        users = {root} if group.module == leading else \
            {group.module, *(first_user.get(t, group.module) for t in group.tensor_ids)}
        for name in sorted(n if n in modules else root for n in users):
            if index not in places.get(name, []):
                places.setdefault(name, []).append(index)
    return places


def outermost(order: list[str], modules: set[str], root: str) -> str:
    """The module whose forward pass ends the recorded ones: the root, unless the loop calls a
    module inside it (Note [The leading group runs at the root]), then the first one called."""
    return root if root in order or not order or order[0] not in modules else order[0]


class GatherPacing:
    """DeAR's all-gathers of the open iteration (the layout's forward-stage blocks): how many
    the runner released, each one block ahead of the update that needs it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._positions: list[int] = []  # the plan positions of the all-gathers
        self._released = 0

    def start(self, positions: list[int]) -> None:
        """step(): the first all-gather goes (and one of look-ahead)."""
        self._positions, self._released = positions, 0
        if positions:
            self.release_through(0)

    def release_through(self, count: int) -> None:
        """Releases the all-gathers before position `count` of the list and one more."""
        positions = self._positions
        while self._released < min(count + 1, len(positions)):
            self._engine.release(positions[self._released])
            self._released += 1

    def release_for(self, position: int) -> None:
        """Releases the all-gathers up to the block at plan `position` when it is one."""
        if position in self._positions:
            self.release_through(self._positions.index(position))

    def release_all(self) -> None:
        if self._released < len(self._positions):
            self.release_through(len(self._positions))


# Note [The last deferred update]
# An overlap plan leaves each step()'s update to the next forward pass, so after the last
# step() of a training loop one update is still pending. The forward pass of an evaluation
# applies it (the pre-hooks run under no_grad as well), and flush() applies it anywhere; but a
# loop that ends with torch.save(model.state_dict()) would save the parameters one update short,
# beside an optimizer state that counts it (optimizer.state_dict() flushes, but after the model
# was read), and commsched.shutdown() would drop it. So the runner applies what it holds
# before any of the model's modules hands out its state_dict, and shutdown() applies what every
# runner holds before it stops the engines (world/registry.py). Both wait only for collectives
# every rank launched at step(), so one rank may do it alone (rank 0 saving the model): its
# peers apply theirs in their next forward pass, to the same parameters. A module's
# load_state_dict() has no public pre-hook on the oldest torch supported (2.4): loading a
# model's weights mid-run calls flush() first.
def apply_before_state_dict(modules: Iterable[nn.Module], apply: Callable[[], None]) -> list[Any]:
    """State-dict pre-hooks on `modules` that call `apply` first (Note [The last deferred
    update]); their handles."""
    def before(module: nn.Module, prefix: str, keep_vars: bool) -> None:
        apply()
    return [module.register_state_dict_pre_hook(before) for module in modules]


# Note [Module hooks under torch.compile]
# An overlap plan's updates run in forward pre-hooks (and the profiling steps time each module
# with hooks). Inside a compiled forward pass dynamo would trace into them: an optimizer step,
# clocks and the engine's waits, which it cannot trace (it failed on the update's param-group
# views). Every such hook is registered through torch_compat.eager_hook, so dynamo breaks the
# graph at the hook and runs it eagerly: at most one break per module whose pre-hook applies an
# update group (where a group starts, and the first user of each of its parameters: Note
# [Skipped group starts]; OverlapRunner.hooked_modules), and at modules in the forward passes
# that record module times (the profiling steps, then the sampled ones). The breaks counted on
# the built-in Transformer are in benchmarks/compile/. A model compiled with fullgraph=True
# forbids graph breaks, so there the overlap policies are refused at wrap time and `auto` plans
# synchronous policies only.
def overlap_possible(model: Any, base_cls: type) -> bool:
    return isinstance(model, torch.nn.Module) and not issubclass(base_cls, _UNSPLITTABLE) \
        and not compiled_fullgraph(model)


def check_overlap_allowed(policy_name: str, model: Any, base_cls: type) -> None:
    if model is None or not isinstance(model, torch.nn.Module):
        raise ValueError(f"commsched: policy '{policy_name}' applies each update in the next "
                         "forward pass and needs the model: DistributedOptimizer(..., model=model)")
    if compiled_fullgraph(model):
        raise ValueError(f"commsched: policy '{policy_name}' applies each update in a forward "
                         "pre-hook, which breaks the graph, and the model was compiled with "
                         "torch.compile(..., fullgraph=True), which forbids graph breaks; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous, no hooks in forward), "
                         "or compile without fullgraph=True")
    if issubclass(base_cls, _UNSPLITTABLE):
        raise ValueError(f"commsched: {base_cls.__name__} needs all gradients at once and cannot "
                         f"be split into per-block updates as policy '{policy_name}' does; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous)")
