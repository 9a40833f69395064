"""Sharded optimizer state (``shard_optimizer=True``): each rank keeps the optimizer state of the
slices the reduce-scatters leave it (Note [Flat slices, not whole parameters] in
plan/sharding.py), steps them at ``step()`` and sends the updated parameters back in the
all-gathers.

What happens to one parameter element in a sharded step: backward hands its gradient to the
engine, which reduce-scatters the block; on the owner, step() scales the summed slice to the
average, the user's optimizer class steps the element (its state lives here, in ``_sub``), the
new value is written where the element's gradient was, and the all-gather copies it to every
rank's gradient tensor, from which it is copied into the parameter.

Note [The sharded state follows the plan]
The slices are the plan's, so a new plan moves them. Profiling plans are not sharded (their
collectives are timed to fit the all-reduce the policies plan with), so the state is whole on
every rank until the first policy plan, and `activate` keeps each rank's slices and drops the
rest. Between two sharded plans (``ddp``'s rebuild, a re-plan) `activate` first gathers the whole
state and cuts the new slices from it: a sum over the ranks of zero-filled tensors that each
owner filled in (an all-reduce per state tensor), rare and exact.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ... import _C
from ...plan import Plan
from ...plan.sharding import SHARDABLE_POLICIES, BlockShard, Segment, shard_layout
from ...torch_compat import unhooked_step
from ...world import World
from ...world.errors import without_backtrace
from ..deferred import HyperParameterSnapshots, grouped_optimizer
from ..engine.step_clock import UpdateTimer

if TYPE_CHECKING:
    from ..engine.handle import EngineHandle


def _elementwise_classes() -> frozenset[type]:
    names = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta",
             "RMSprop", "Rprop", "ASGD")
    return frozenset(getattr(torch.optim, n) for n in names if hasattr(torch.optim, n))


# torch.optim's optimizers that update every element from its own gradient and state: a slice
# of a parameter steps as the whole would (Note [Flat slices, not whole parameters]). LBFGS
# needs every parameter at once; Adafactor and SparseAdam need a parameter's shape or layout;
# another class may take a global norm.
ELEMENTWISE = _elementwise_classes()


def check_shardable(base_cls: type[torch.optim.Optimizer]) -> None:
    """Refuses an optimizer whose update of one element reads more than that element.

    Args:
        base_cls: the user's optimizer class.

    Raises:
        TypeError: `base_cls` is not one of torch.optim's element-wise optimizers.
    """
    if base_cls not in ELEMENTWISE:
        allowed = ", ".join(sorted(c.__name__ for c in ELEMENTWISE))
        raise TypeError(
            f"commsched: shard_optimizer=True (COMMSCHED_SHARD_OPTIMIZER) cannot shard "
            f"{base_cls.__module__}.{base_cls.__qualname__}: each rank steps a flat slice of the "
            "parameters, so the optimizer must update every element from that element's "
            f"gradient and state alone ({allowed}); LBFGS, Adafactor, SparseAdam or an "
            "optimizer with a global norm need whole parameters")


def check_sharding_allowed(policy: str, base_cls: type[torch.optim.Optimizer],
                           compressed: bool, process_set: Any) -> None:
    """What shard_optimizer=True runs with, checked at wrap time.

    Args:
        policy: the configured policy's name.
        base_cls: the user's optimizer class.
        compressed: whether a compression (a cast or a lossy compressor) was asked for.
        process_set: the wrap's process set (None for the whole world).

    Raises:
        TypeError: the optimizer cannot step slices (check_shardable).
        ValueError: the policy, a compression or a process set, which sharding does not run
            with yet.
    """
    check_shardable(base_cls)
    knob = "shard_optimizer=True (COMMSCHED_SHARD_OPTIMIZER)"
    if policy not in (*SHARDABLE_POLICIES, "auto"):
        raise ValueError(f"commsched: {knob} runs under {', '.join(SHARDABLE_POLICIES)} and "
                         "auto (choosing among them) so far (the all-gathers at step(), or in "
                         f"the next forward pass under dear), not policy '{policy}'")
    if compressed:
        raise ValueError(f"commsched: {knob} cannot run with compression: the all-gathers "
                         "carry parameters, which a cast or a lossy compressor would alter")
    if process_set is not None:
        raise ValueError(f"commsched: {knob} does not run on a process set yet")


class ShardedState:
    """The optimizer state of this rank's slices, and the sharded step that updates them."""

    def __init__(self, base_cls: type[torch.optim.Optimizer], user: torch.optim.Optimizer,
                 params: list[torch.Tensor], world: World, postscale: float,
                 engine: EngineHandle) -> None:
        self._base_cls = base_cls
        self._engine = engine  # whose profiler times each slice's update
        # No step hooks: the user's step() ran them (torch_compat.unhooked_step).
        self._step = unhooked_step(base_cls)
        # Weakly, as the deferred updates hold it (Note [a dropped optimizer releases its
        # engine] in release.py).
        self._user_ref = weakref.ref(user)
        self._params = params
        self._world = world
        self._postscale = postscale
        self._snapshots = HyperParameterSnapshots(user)
        self._group_of = {id(p): i for i, g in enumerate(user.param_groups) for p in g["params"]}
        self.layout: tuple[BlockShard, ...] = ()
        # One leaf view of each owned segment of a parameter (into p.data), and the optimizer
        # of the user's class over them, whose `state` is the only copy of the sharded state.
        self._views: list[tuple[Segment, torch.Tensor]] = []
        self._sub: torch.optim.Optimizer | None = None
        self._block_subs: list[torch.optim.Optimizer] = []  # per block, sharing _sub's state
        self._next: Plan | None = None  # the engine's sharded plan (None: unsharded)
        self._moved = False  # whether _next is new since the last follow_plan()

    @property
    def _user(self) -> torch.optim.Optimizer:
        user = self._user_ref()
        if user is None:
            raise RuntimeError("commsched: the wrapped optimizer is gone")
        return user

    @property
    def active(self) -> bool:
        return self._sub is not None

    def install(self, run: Plan | None) -> None:
        """Takes note of the engine's new plan (None: an unsharded one). The state moves at the
        next follow_plan(): the update of the iteration that installed it is still to come."""
        self._next = run
        self._moved = True

    def loaded(self) -> None:
        """After the optimizer loaded a whole state: the slices are cut from it afresh at the
        next follow_plan() (the old slices, and the old param-group dicts, are dropped)."""
        self._sub, self._block_subs, self._views, self.layout = None, [], [], ()
        self._moved = True

    def follow_plan(self) -> bool:
        """At step(), before the update: moves the state to the installed plan's slices if
        that plan is new. Returns whether this step is sharded."""
        if self._moved:
            self._moved = False
            self.activate(self._next)
        return self._sub is not None

    # -- the step -----------------------------------------------------------------------------

    def step(self, reduced: Callable[[int], torch.Tensor],
             gradient_of: Callable[[int], torch.Tensor],
             release: Callable[[int], None] | None) -> float:
        """Updates this rank's slices and hands the updated parameters to the all-gathers.

        Args:
            reduced: reduced(position) -> this rank's summed slice of the completed
                reduce-scatter at that plan position (waiting for it first).
            gradient_of: gradient_of(tensor id) -> the gradient tensor the engine holds for that
                parameter, where the all-gather packs from and unpacks to.
            release: release(position) -> launches the all-gather at that plan position; None
                where the caller releases them later (DeAR's, in the next forward pass).

        Returns:
            The seconds the updates took, waits for the reduce-scatters excluded (the
            profile's step_s: one optimizer call per block, each timed for the profile's
            cost of a call where the profiler keeps this iteration).
        """
        assert self._sub is not None
        self._snapshots.take()
        views = iter(self._views)
        busy_us, sampling = 0, self._engine.sampling
        # Block by block, in the order the reduce-scatters complete: each slice's update runs
        # while the later reduce-scatters are still on the wire.
        for block, sub in zip(self.layout, self._block_subs, strict=True):
            shard = reduced(block.reduce_position)
            started = _C.now_us()
            owned = [next(views) for _ in block.segments]
            for segment, view in owned:
                view.grad = shard.narrow(0, segment.shard_offset, segment.numel).view_as(view) \
                    .mul(self._postscale)
            if owned:
                timer = UpdateTimer([view for _, view in owned], sub.state) \
                    if sampling else None
                self._step(sub)
                if timer is not None:
                    self._engine.profiler.note_update(
                        sum(v.numel() * v.element_size() for _, v in owned), timer.stop(),
                        timer.made_state)
            for segment, view in owned:
                view.grad = None
                gradient_of(segment.tensor_id).view(-1).narrow(
                    0, segment.offset, segment.numel).copy_(view)
            busy_us += _C.now_us() - started
            if release is not None:
                release(block.gather_position)
        return busy_us / 1e6

    def step_later(self, reduced: Callable[[int], torch.Tensor]
                   ) -> Callable[[Callable[[int], torch.Tensor]], float]:
        """The step for the overlap runner, which releases the all-gathers in the next forward
        pass: it calls it with each tensor id's gradient before releasing any."""
        return lambda gradient_of: self.step(reduced, gradient_of, None)

    def finish(self) -> None:
        """After the all-gathers: every parameter takes the values gathered into its gradient,
        and the gradient is cleared (it holds parameters now, not a gradient to read)."""
        with torch.no_grad():
            for p in self._params:
                if p.grad is not None:
                    p.copy_(p.grad)
                    p.grad = None

    # -- moving the state with the plan (Note [The sharded state follows the plan]) -----------

    def activate(self, plan: Plan | None) -> None:
        """Shards the state for `plan` (a sharded plan), or gathers it whole (None)."""
        whole = self.whole_state() if self._sub is not None else None
        if whole is not None:
            self._user.state.clear()
            for p, entry in whole.items():
                self._user.state[p] = entry
        self._sub, self._block_subs, self._views, self.layout = None, [], [], ()
        self._snapshots.forget_views()
        if plan is None:
            return
        self.layout = shard_layout(plan, self._world.size, self._world.rank)
        self._views = [(segment, self._param_view(segment)) for block in self.layout
                       for segment in block.segments]
        self._sub = self._make_sub(self._views, collections.defaultdict(dict))
        views = iter(self._views)
        # One state, stepped block by block.
        self._block_subs = [self._make_sub([next(views) for _ in block.segments],
                                           self._sub.state) for block in self.layout]
        for segment, view in self._views:
            whole_entry = self._user.state.get(self._params[segment.tensor_id])
            if whole_entry:
                self._sub.state[view] = {k: _cut(v, segment) for k, v in whole_entry.items()}
        for p in self._params:  # the whole state now lives in the slices
            self._user.state.pop(p, None)

    def _param_view(self, segment: Segment) -> torch.Tensor:
        p = self._params[segment.tensor_id]
        return p.detach().view(-1).narrow(0, segment.offset, segment.numel)

    def _make_sub(self, views: list[tuple[Segment, torch.Tensor]],
                  state: collections.defaultdict[torch.Tensor, Any]
                  ) -> torch.optim.Optimizer:
        """The user's optimizer class over `views`, each in its parameter's param group."""
        members: list[list[torch.Tensor]] = [[] for _ in self._user.param_groups]
        for segment, view in views:
            members[self._group_of[id(self._params[segment.tensor_id])]].append(view)
        return grouped_optimizer(self._base_cls, self._user, members, self._snapshots, state)

    # -- the whole state ----------------------------------------------------------------------

    def whole_state(self) -> dict[torch.Tensor, dict[str, Any]]:
        """Every parameter's state as the unsharded optimizer would hold it, on every rank.

        Returns:
            {parameter: {key: value}} for each parameter with state somewhere.
        """
        assert self._sub is not None
        mine: dict[int, dict[str, Any]] = {}
        for segment, view in self._views:
            entry = self._sub.state.get(view)
            if entry and segment.tensor_id not in mine:
                mine[segment.tensor_id] = {k: _describe(v, view) for k, v in entry.items()}
        try:
            described: dict[int, dict[str, Any]] = {}
            for theirs in self._world.all_gather_object(mine):
                for tid, entry in theirs.items():
                    described.setdefault(tid, entry)
            return {self._params[tid]: {key: self._gather(tid, key, kind) for key, kind in
                                        described[tid].items()} for tid in sorted(described)}
        except RuntimeError as err:
            raise self._world.fail(
                "commsched: with shard_optimizer=True, state_dict() gathers every rank's slices "
                "of the optimizer state, and a rank did not take part within COMMSCHED_TIMEOUT: "
                "call state_dict() on every rank (as DeepSpeed's save_checkpoint and FSDP's "
                f"optim_state_dict require), and save on rank 0 ({without_backtrace(err)})"
            ) from None

    def _gather(self, tid: int, key: str, kind: Any) -> Any:
        if kind[0] != "slice":
            return kind[1]
        p = self._params[tid]
        full = torch.zeros(p.numel(), dtype=kind[1], device=p.device)
        for segment, view in self._owned(tid):
            full.narrow(0, segment.offset, segment.numel).copy_(
                self._sub.state[view][key].view(-1))  # type: ignore[union-attr]
        if self._world.size > 1:
            dist.all_reduce(full, group=self._world.control_group)
        return full.view_as(p)

    def _owned(self, tid: int) -> Iterator[tuple[Segment, torch.Tensor]]:
        return ((s, v) for s, v in self._views if s.tensor_id == tid)


def whole_state_dict(optimizer: torch.optim.Optimizer, sharded: ShardedState | None,
                     torch_state_dict: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The optimizer's own state_dict() (`torch_state_dict`), with every rank's slices gathered
    into it while `sharded` is active: what the plain optimizer loads. Every rank calls it."""
    if sharded is None or not sharded.active:
        return torch_state_dict()
    mine = optimizer.state
    optimizer.state = collections.defaultdict(dict, {**mine, **sharded.whole_state()})
    try:
        return torch_state_dict()
    finally:
        optimizer.state = mine


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of optimizer state this rank holds for `optimizer`: its element-wise tensors
    (momentum, moments), with a commsched wrapper's slices under shard_optimizer and the local
    optimizer of torch's ZeroRedundancyOptimizer.

    Args:
        optimizer: a torch optimizer, a commsched wrapper or a ZeroRedundancyOptimizer.

    Returns:
        The bytes of the tensors held, scalars (step counts) left out.
    """
    states = [optimizer.state]
    local = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's own shard
    if isinstance(local, torch.optim.Optimizer):
        states = [local.state]
    session = getattr(optimizer, "session", None)
    sharded = getattr(getattr(session, "lifecycle", None), "sharded", None)
    if isinstance(sharded, ShardedState) and sharded._sub is not None:
        states.append(sharded._sub.state)
    return sum(v.numel() * v.element_size() for state in states for entry in state.values()
               for v in entry.values() if isinstance(v, torch.Tensor) and v.dim() > 0)


def _cut(value: Any, segment: Segment) -> Any:
    """A parameter's state value as its segment's: an element-wise tensor sliced, the rest (a
    step count, a 0-d tensor) copied."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.reshape(-1).narrow(0, segment.offset, segment.numel).clone()
    return value.clone() if isinstance(value, torch.Tensor) else value


def _describe(value: Any, view: torch.Tensor) -> tuple[str, Any]:
    """How a segment's state value is made whole: ("slice", dtype) for an element-wise
    tensor, else ("value", the value itself), the same on every owner."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == view.numel():
        return ("slice", value.dtype)
    return ("value", value.clone() if isinstance(value, torch.Tensor) else value)
