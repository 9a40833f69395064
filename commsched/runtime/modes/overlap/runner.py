"""Cross-iteration overlap: ``step()`` returns while gradients are still on the wire; the
updates are applied in the next iteration's forward pass, group by group, just before the first
module that needs each group's parameters.

Timeline of one iteration (after the profiling steps):
    backward: hooks hand gradients to the engine, which launches the plan's backward blocks
    step():   the rest is launched; gradients are taken from ``p.grad`` (the engine owns them);
              hyper-parameters are snapshotted; for DeAR the first all-gather is released
    forward:  pre-hook of a module that starts an update group (plan.update_groups, chosen by
              the planner: plan/update_groups.py): release the all-gathers up to the one the
              group needs plus one (look-ahead), wait for the group's last block, apply its
              update with one call of the user's optimizer restricted to its parameters
    end of the root module's forward (or, when the groups hold every parameter, the first
              gradient of backward: Note [The end of the forward pass]): wait for everything,
              apply what is left (parameters not used in this forward), and the engine is ready
              for the next backward
During the profiling steps every module has hooks that record the forward order and each
module's time; once an overlap plan runs, only the modules that start a group keep one, except
in the forward passes the profiler samples (Note [Module times at steady state]).

Beside the runner: DeAR's all-gather pacing it owns (GatherPacing), its state-dict pre-hooks
(Note [The last deferred update]), and whether a wrapped model and optimizer can run it at all
(check_overlap_allowed).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .... import _C
from ....plan import Plan
from ....torch_compat import compiled_fullgraph, eager_hook, guard_module_hooks
from ....world import registry
from ...deferred import DeferredUpdates
from ...engine.step_clock import UpdateTimer
from .guard import PendingReadGuard
from .layout import GroupWork, PlanLayout, first_users, leftovers, outermost, plan_layout
from .module_profile import ModuleProfile
from .piecewise import PiecewiseUpdate

if TYPE_CHECKING:
    from ...engine.handle import EngineHandle


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


# Note [The end of the forward pass]
# The root's forward hook (or, where the loop calls a module inside `model=`, the outermost
# module's) applies what the forward pass did not reach: parameters in no group, and groups
# whose modules all were skipped. When the groups hold every tensor, only the second can happen,
# and those parameters took no part in the forward pass, so their update may as well wait for
# finish() at the first gradient of backward (or at step(), flush()), which must wait for the
# iteration's blocks anyway: the forward hook is left out, one Python call per iteration fewer
# (a world of one, or a plan with one group, has nothing else at the end of the forward pass).


class HookMode(enum.Enum):
    RECORDING = "recording"  # every module: forward order and times (profiling steps)
    ACTIVE = "active"  # first users of a group's parameters, and the root's end of forward
    OFF = "off"  # a synchronous plan runs (`auto` chose one)


class OverlapRunner:
    def __init__(self, deferred: DeferredUpdates, model: nn.Module, params: list[torch.Tensor],
                 engine: EngineHandle, modules: ModuleProfile | None = None,
                 mid_iteration: bool = False) -> None:
        self._deferred = deferred
        self._snapshot = deferred.snapshot_call()
        self._engine = engine
        self._params = params
        self._tid = {id(p): i for i, p in enumerate(params)}
        self.modules = modules or ModuleProfile()  # an elastic job's earlier runner's
        self._named = dict(model.named_modules())
        self._owned = {name: [self._tid[id(p)] for p in m.parameters(recurse=False)
                              if id(p) in self._tid]
                       for name, m in self._named.items()}
        # Note [No forward pass on a pending update] in overlap/guard.py
        self.guard = PendingReadGuard({t: name for name, tids in reversed(self._owned.items())
                                       for t in tids}, len(params), mid_iteration)
        self._update_us = 0
        self.open = False
        # Note [Stamps, not sets]
        # What is still to apply in the open iteration is kept as iteration stamps: step()
        # bumps `_stamp`, and a group (or, with groups that share tensors, a slot) is applied
        # when its entry holds the current stamp. No set or dict is built per iteration: on a
        # small model each Python statement of the per-iteration path is a measurable part of
        # the runner's cost.
        self._stamp = 0
        self._group_done: list[int] = []
        self._slot_done: list[int] = []
        # The taken gradients, by slot (a parameter without one has None: set_grads leaves it
        # so, and no compressed tensor lacks one).
        self._grads: list[torch.Tensor] = []
        # The plan's update groups, slots and all-gathers, worked out by activate() (empty
        # until then).
        self._layout = PlanLayout()
        self._piecewise: dict[int, PiecewiseUpdate] = {}  # group index -> its pieces, if any
        self._bytes_of: dict[tuple[int, ...], int] = {}
        self.gathers_parameters = False  # shard_optimizer: a group's update is a copy
        self._slot_of: dict[int, int] = {}  # tensor id -> slot, for the sharded step
        self._gathers = GatherPacing(engine)  # DeAR's all-gathers of the open iteration
        self._handles: list[Any] = []
        self._root_name = ""
        self.mode = HookMode.OFF
        self.active = False
        self._sampled = False  # whether the coming forward pass records module times
        self._set_mode(HookMode.RECORDING)
        # See Note [The last deferred update].
        self._state_hooks = apply_before_state_dict(self._named.values(), self.finish)
        registry.register_deferring(self)

    @property
    def recording(self) -> bool:
        return self.mode is HookMode.RECORDING

    @property
    def hooked_modules(self) -> list[str]:
        """The modules below the root whose pre-hooks apply update groups now (none while no
        overlap plan runs): where a compiled forward pass breaks its graph (Note [Module hooks
        under torch.compile]). The root's own hooks run outside a compiled module's frame."""
        if not self.active:
            return []
        return sorted(name for name in self._layout.groups_at if name != self._root_name)

    def _set_mode(self, mode: HookMode, sampled: bool = False) -> None:
        """Registers only the hooks `mode` needs: under an overlap plan, the modules that are
        the first user of some parameter (a hook is a Python call per forward; the expensive
        part, one optimizer call, happens only where a group starts), and, for a forward pass
        the profiler samples, every module's recording hooks (Note [Module times at steady
        state] in overlap/module_profile.py)."""
        guard_module_hooks()  # before a compiled forward pass meets the hooks below
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.mode = mode
        self.guard.recording = mode is HookMode.RECORDING  # it notes which tensors got gradients
        self._sampled = sampled
        # Whether an overlap plan runs: step() leaves the updates to the next forward pass (an
        # attribute, read at every step()).
        self.active = mode is HookMode.ACTIVE
        if mode is HookMode.RECORDING or sampled:
            # First, so that the root's time ends before the end-of-forward hook's finish().
            self._handles.extend(self.modules.attach(self._named, self._root_name))
        if mode is HookMode.ACTIVE:
            for name in self._layout.groups_at:
                module = self._named[name]  # activate() mapped unknown names to the root
                self._handles.append(module.register_forward_pre_hook(
                    eager_hook(self._apply_groups(name, timed=sampled))))
            if self._layout.ungrouped:  # Note [The end of the forward pass]
                top = self._named[outermost(self.modules.order, set(self._named),
                                            self._root_name)]
                self._handles.append(top.register_forward_hook(eager_hook(self._end_of_forward)))

    # -- activation -------------------------------------------------------------------------

    def first_users(self) -> dict[int, str]:
        """Tensor id -> the module (observed forward order) whose pre-hook applies its update."""
        return first_users(self.modules.order, self._owned) if self.modules.order else {}

    def activate(self, plan: Plan) -> None:
        """Installs the plan's update groups (one per first-user module when the plan has none)
        and the hooks that apply them."""
        # The gradients of an open iteration are held by the slots of the plan they were taken
        # under; a plan is installed only on an idle engine (PlanLifecycle.install finishes the
        # runner first, load_state_dict flushes), so none is open here.
        assert not self.open, "commsched: an overlap plan was activated inside an iteration"
        # A lossy compressor's gradients are rebuilt just before their group's update (Note
        # [Compression under an overlap plan] in compression/gradients.py).
        compressed = self._engine.comm_hook.running()
        order = self.modules.order or [self._root_name]  # none recorded: all at the root
        layout = self._layout = plan_layout(plan, self._params, order, self._owned,
                                            set(self._named), self._root_name, compressed)
        self.guard.policy = plan.policy
        self.guard.check_plan(self.first_users(), set(self.modules.order))
        self._bytes_of.clear()  # keyed by slots, which the new plan numbers afresh
        self._piecewise = {i: PiecewiseUpdate(self._deferred, w.pieces, layout.taken_params)
                           for i, w in enumerate(layout.work) if w.pieces}
        self._slot_of = {self._tid[id(p)]: s for s, p in enumerate(layout.taken_params)}
        self._group_done = [self._stamp] * len(layout.groups)  # nothing pending until step()
        self._slot_done = [self._stamp] * len(layout.taken_ids)
        self._set_mode(HookMode.ACTIVE)

    def restore(self, order: list[str], active: bool, recording: bool, plan: Plan) -> None:
        """Puts the runner where a checkpoint left it. The forward order decides in which
        module's pre-hook each update runs when the plan has no update groups."""
        self.modules.order = list(order)
        if active:
            self.activate(plan)
        else:
            self._set_mode(HookMode.RECORDING if recording else HookMode.OFF)

    def update_seconds_so_far(self) -> float:
        """Time spent applying updates since the last take_update_seconds() (at step())."""
        return self._update_us / 1e6

    def take_update_seconds(self) -> float:
        """Time spent applying updates since the last call (the profiler's step_s)."""
        seconds, self._update_us = self._update_us / 1e6, 0
        return seconds

    def deactivate(self) -> None:
        """A synchronous plan replaced the overlap one (`auto`): no hooks are left."""
        self._set_mode(HookMode.OFF)

    # -- step ---------------------------------------------------------------------------------

    def begin(self, shard_step: Callable[[Callable[[int], torch.Tensor]], float] | None = None
              ) -> None:
        """Called by step(): everything is launched; the updates wait for the next forward.
        `shard_step` (shard_optimizer) updates this rank's slices before any all-gather goes,
        given each tensor id's gradient, where the all-gathers pack from; it returns the
        seconds its updates took."""
        if self.guard.held:  # after backward, before this step's gradients are taken
            self._apply_held()
        self._snapshot()
        grads = self._grads = _C.take_grads(self._layout.taken_params)
        if shard_step is not None:  # its updates are this step()'s (the profile's step_s)
            self._update_us += int(1e6 * shard_step(lambda tid: grads[self._slot_of[tid]]))
        self._stamp += 1  # every group and slot is pending (Note [Stamps, not sets])
        self.open = True
        if self._engine.sampling != self._sampled:
            self._set_mode(HookMode.ACTIVE, sampled=self._engine.sampling)
        self._gathers.start(self._layout.gathers)

    def release_for(self, position: int) -> None:
        """Releases the all-gathers up to the block at `position` when it is one (the second
        round of a compressor waits for its first round's blocks at step())."""
        self._gathers.release_for(position)

    def finish(self, after_forward: bool = False) -> None:
        """Waits for every block of the open iteration and applies every pending update; after
        a forward pass, what it left pending waits (Note [No forward pass on a pending update])."""
        if self.guard.held:
            self._apply_held()
        if not self.open:
            return
        self._gathers.release_all()
        self._engine.wait()
        self.open = False
        left = leftovers(self._layout, self._slot_done, self._group_done, self._stamp)
        if left and after_forward:
            self.guard.hold(left, self._layout.taken_ids)
            return
        if left:
            self._apply(left)
        self._grads = []

    def _apply_held(self) -> None:
        """Applies what a finish after a forward pass held back (PendingReadGuard.hold)."""
        self._apply(self.guard.take_held())
        self._grads = []

    def _apply(self, slots: list[int], work: GroupWork | None = None) -> None:
        """Applies the update of `slots` (`work`'s whole group when given) with one call of the
        user's optimizer."""
        layout = self._layout
        optimizer = None
        if work is not None:
            params, nbytes = work.params, work.nbytes
            deferred = self._deferred
            if work.generation != deferred.generation:
                work.optimizer, work.generation = deferred.subset(params), deferred.generation
            optimizer = work.optimizer
        else:
            params = [layout.taken_params[s] for s in slots]
            key = tuple(slots)
            known = self._bytes_of.get(key)
            if known is None:  # the same leftovers come back every iteration
                known = self._bytes_of[key] = sum(p.numel() * p.element_size() for p in params)
            nbytes = known
        if layout.decompressed:  # its time is the compressor's (compute.compression_s)
            self._decompress(slots)
        grads = [self._grads[s] for s in slots]
        if self.gathers_parameters:
            self._timed(params, nbytes, lambda: _copy_gathered(params, grads))
        else:
            self._timed(params, nbytes, lambda: self._deferred.apply(params, grads, optimizer))
        if not layout.disjoint:
            done, stamp = self._slot_done, self._stamp
            for s in slots:
                done[s] = stamp

    def _timed(self, params: list[torch.Tensor], nbytes: int, update: Callable[[], Any]) -> None:
        """Runs one update call of `params`, timed for the profiler and the timeline. Device
        events on CUDA (Note [Which clock]), only when the profiler keeps this iteration. A
        sharded group's copy is no optimizer call: its time is the forward's."""
        started, engine = _C.now_us(), self._engine
        timer = UpdateTimer(params, self._deferred.user.state) \
            if engine.sampling and not self.gathers_parameters else None
        update()
        if timer is not None:
            engine.profiler.note_update(nbytes, timer.stop(), timer.made_state)
        self._update_us += 0 if self.gathers_parameters else _C.now_us() - started
        if engine.timeline:
            engine.span("update", started, tensors=len(params))

    def _decompress(self, slots: list[int]) -> None:
        hook = self._engine.comm_hook
        decompressed = self._layout.decompressed
        for s in slots:
            index = decompressed.get(s)
            if index is not None:
                hook.decompress(index, self._grads[s])

    # -- module hooks -------------------------------------------------------------------------

    def _apply_groups(self, name: str, timed: bool) -> Callable[[nn.Module, Any], None]:
        """The pre-hook applying `name`'s pending groups; `timed`: in a forward pass that
        records module times, what it spends is left out of them."""
        indices = self._layout.groups_at[name]

        def hook(module: nn.Module, args: Any) -> None:
            if not self.open:
                return
            done, stamp = self._group_done, self._stamp
            for index in indices:
                if done[index] != stamp:
                    self._apply_group(index)
        if not timed:
            return hook
        modules = self.modules

        def timed_hook(module: nn.Module, args: Any) -> None:
            started = time.perf_counter()
            hook(module, args)
            modules.excluded_s += time.perf_counter() - started
        return timed_hook

    def _apply_group(self, index: int) -> None:
        stamp, layout = self._stamp, self._layout
        self._group_done[index] = stamp
        work = layout.work[index]
        # A group's tensors are applied with it, or all at once by finish(), which closes the
        # iteration: with no tensor in two groups, a pending group has every tensor pending.
        if layout.disjoint:
            slots = work.slots
        else:
            done = self._slot_done
            slots = [s for s in work.slots if done[s] != stamp]
        if not slots:
            return
        if layout.gathers:
            self._gathers.release_through(work.gathers_through)
        piecewise = self._piecewise.get(index)  # Note [A large group is updated piece by piece]
        if piecewise is not None and layout.disjoint \
                and piecewise.apply(self._grads, self._engine.wait_block, self._timed):
            return
        self._engine.wait_block(work.wait_for)
        self._apply(slots, work if layout.disjoint else None)

    def _end_of_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self.finish(after_forward=True)

    def remove(self) -> None:  # its hooks, and what it still defers (an elastic restore)
        for handle in self._handles + self._state_hooks:
            handle.remove()
        self._handles, self._state_hooks, self._grads, self.open = [], [], [], False
        self.guard.take_held()
        registry.unregister_deferring(self)


def _copy_gathered(params: list[torch.Tensor], gathered: list[torch.Tensor]) -> None:
    """A sharded group's update: the parameters the all-gathers brought, copied into place."""
    with torch.no_grad():
        for param, value in zip(params, gathered, strict=True):
            param.copy_(value)


# Optimizers whose step needs every gradient at once: they cannot be split into per-block updates.
_UNSPLITTABLE = (torch.optim.LBFGS,)


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
