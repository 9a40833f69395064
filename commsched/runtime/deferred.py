"""Updates applied later than ``step()``: the user's optimizer restricted to a subset of its
parameters, with the hyper-parameters it had at ``step()``.

Used by the overlap runner (each group's update in the next forward pass) and by the sparse
route (sparse parameters updated at ``step()`` while the dense ones wait): one helper, so that
both snapshot, cache and step the same way.

Made with ``object.__new__`` and ``Optimizer.__init__`` rather than by copying the user
optimizer's ``__dict__``: an LR scheduler patches ``step`` on the instance, and a copy of that
would step every parameter. The subset optimizer shares ``state`` with the user's optimizer (so
``state_dict()`` covers every block) and its parameter groups are views: ``params`` is the
subset, every other key reads the hyper-parameters as they were when ``step()`` was called (an
LR scheduler may already have moved on when the deferred update runs) and writes through.
"""

from __future__ import annotations

import collections
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _C
from ..torch_compat import unhooked_step
from .engine.profiler import EventSpan
from .engine.step_clock import UpdateTimer


class HyperParameterSnapshots:
    """Per user param group, its hyper-parameters at the last ``step()``; the views made from
    it are refreshed with every snapshot."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = _WeakOptimizer(optimizer)
        self.groups: list[dict[str, Any]] = []
        # Per snapshot group, what reads its keys' values from a user group (one C call) and
        # the values taken, for the identity check at every step().
        self._readers: list[Callable[[dict[str, Any]], tuple[Any, ...]]] = []
        self._values: list[tuple[Any, ...]] = []
        self._views: list[ParamGroupView] = []
        self.take()

    def take(self) -> None:
        user = self._optimizer.ref()  # not through _WeakOptimizer's call: once per step()
        if user is None:
            raise RuntimeError("commsched: the wrapped optimizer is gone")
        user_groups = user.param_groups
        if len(user_groups) == len(self.groups) \
                and all(map(_holds_the_same, user_groups, self._readers, self._values)):
            return  # taken at every step(): most steps change no hyper-parameter
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in user_groups]
        self._readers = [_reader(tuple(g)) for g in self.groups]
        self._values = [tuple(g.values()) for g in self.groups]
        for view in self._views:
            view.refresh(self.groups[view.index])

    def register(self, view: ParamGroupView) -> None:
        self._views.append(view)

    def forget_views(self) -> None:
        self._views.clear()


def _reader(keys: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A group's values of `keys`, as a tuple (KeyError where one is missing)."""
    if len(keys) == 1:
        key = keys[0]
        return lambda group: (group[key],)
    return operator.itemgetter(*keys) if keys else lambda group: ()


def _holds_the_same(user_group: dict[str, Any],
                    reader: Callable[[dict[str, Any]], tuple[Any, ...]],
                    values: tuple[Any, ...]) -> bool:
    """Whether the user's group holds the very objects a snapshot took (identity, not equality:
    an LR scheduler stores a new number, and a tensor hyper-parameter compares element-wise)."""
    if len(user_group) != len(values) + 1:
        return False
    try:
        current = reader(user_group)
    except KeyError:  # a key replaced by another
        return False
    return all(map(operator.is_, current, values))


class ParamGroupView(dict):
    """A param group of the subset optimizer: a plain dict holding ``params`` (the subset) and
    the hyper-parameters as snapshotted at ``step()`` (refreshed by each snapshot), so that the
    optimizer's many reads cost what a dict's do. Writes go through to the user's group and the
    snapshot as well."""

    def __init__(self, user_group: dict[str, Any], params: list[torch.Tensor],
                 snapshots: HyperParameterSnapshots, index: int) -> None:
        super().__init__()
        self._user = user_group
        self._params = params
        self._snapshots = snapshots
        self.index = index
        self.refresh(snapshots.groups[index])
        snapshots.register(self)

    def refresh(self, hyper: dict[str, Any]) -> None:
        dict.clear(self)
        dict.__setitem__(self, "params", self._params)
        dict.update(self, hyper)

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        if key == "params":
            self._params = value
        else:
            self._user[key] = value
            self._snapshots.groups[self.index][key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)


# The wrapper's session, GradScaler's per-step attributes (set on the optimizer for the
# duration of one step() only: a copy would go stale), and fused optimizers' claim to handle
# the scaler themselves, which the wrapper answers for them (Note [GradScaler asks before it
# unscales] in grad_scaler.py).
_NOT_ADOPTED = ("session", "grad_scale", "found_inf", "_step_supports_amp_scaling")

# Distinct subsets kept with their sub-optimizer: a plan uses a fixed few; leftover sets vary.
_MAX_SUBSETS = 64


def adopt_plain_attributes(target: torch.optim.Optimizer, source: torch.optim.Optimizer) -> None:
    """Carries over instance attributes the optimizer's own __init__ set (fused flags, LBFGS's
    caches) but no callables: an LR scheduler wraps ``step`` in a plain function stored on the
    instance, and a copy of that would step the source optimizer instead."""
    for key, value in vars(source).items():
        if key.startswith("_cs_") or key in _NOT_ADOPTED or key in vars(target) \
                or callable(value):
            continue
        setattr(target, key, value)


def block_optimizer(base_cls: type[torch.optim.Optimizer], user: torch.optim.Optimizer,
                    params: list[torch.Tensor], snapshots: HyperParameterSnapshots
                    ) -> torch.optim.Optimizer:
    """An instance of `base_cls` that steps only `params`, sharing `user`'s state and groups."""
    wanted = {id(p) for p in params}
    return grouped_optimizer(base_cls, user, [[p for p in group["params"] if id(p) in wanted]
                                              for group in user.param_groups],
                             snapshots, user.state)


def grouped_optimizer(base_cls: type[torch.optim.Optimizer], user: torch.optim.Optimizer,
                      members: list[list[torch.Tensor]], snapshots: HyperParameterSnapshots,
                      state: collections.defaultdict[torch.Tensor, Any]
                      ) -> torch.optim.Optimizer:
    """An instance of `base_cls` that steps `members[i]` with the hyper-parameters of `user`'s
    param group i (views of it, refreshed by `snapshots`) and keeps its state in `state`: a
    subset of the user's parameters (block_optimizer), or slices of them
    (runtime/modes/shard_state.py).
    """
    sub = object.__new__(base_cls)
    params = [p for group in members for p in group]
    # torch refuses an optimizer of no parameters; a rank may own no slice of a plan at all.
    torch.optim.Optimizer.__init__(sub, [{"params": params or [torch.zeros(0)]}], user.defaults)
    adopt_plain_attributes(sub, user)
    sub.state = state
    sub.param_groups = [ParamGroupView(group, group_members, snapshots, index)
                        for index, (group, group_members)
                        in enumerate(zip(user.param_groups, members, strict=True))
                        if group_members]
    return sub


class _WeakOptimizer:
    """The user's (wrapped) optimizer, held weakly: it holds its session, which holds this, and
    a strong reference back would keep a dropped optimizer, and its engine's threads, alive until
    a garbage collection (see Note [a dropped optimizer releases its engine] in release.py)."""

    __slots__ = ("ref",)

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.ref = weakref.ref(optimizer)

    def __call__(self) -> torch.optim.Optimizer:
        optimizer = self.ref()
        if optimizer is None:
            raise RuntimeError("commsched: the wrapped optimizer is gone")
        return optimizer


class DeferredUpdates:
    """Steps subsets of the user's parameters with the user's optimizer, later than step().

    ``snapshot()`` at ``step()`` freezes the hyper-parameters the deferred updates will use; the
    sub-optimizer for each subset is made once and cached (the subsets a plan uses are fixed).
    """

    def __init__(self, base_cls: type[torch.optim.Optimizer], user: torch.optim.Optimizer) -> None:
        self._base_cls = base_cls
        self._user_ref = _WeakOptimizer(user)
        self._snapshots = HyperParameterSnapshots(user)
        self._subs: dict[tuple[int, ...], torch.optim.Optimizer] = {}
        # Counts invalidate() calls: a sub-optimizer from subset() is stale once it moved on.
        self.generation = 0
        # torch wraps every optimizer class's step with profiler spans and the step hooks; the
        # user's step() already ran that wrapper once, so the subsets (and the wrapper's own
        # synchronous update, from inside that step()) call the step itself: through the
        # wrapper again, the user's step hooks would run twice per step.
        self.base_step = unhooked_step(base_cls)
        # Splitting one update into calls on subsets is exact for torch's own optimizers, which
        # update each parameter from its own gradient and state; others may clip by a global
        # norm or sum over every parameter (LAMB, D-Adaptation), and GradScaler hands a fused
        # optimizer its scale for one whole step only.
        self.splittable = base_cls.__module__.startswith("torch.optim")

    @property
    def user(self) -> torch.optim.Optimizer:
        """The user's (wrapped) optimizer."""
        return self._user_ref()

    @property
    def base_cls(self) -> type[torch.optim.Optimizer]:
        """The user's optimizer class, whose step the sub-optimizers run."""
        return self._base_cls

    def invalidate(self) -> None:
        """Drops every cached sub-optimizer: after the user's optimizer loaded a state_dict (its
        state and param-group dicts are new objects, which the subsets must share), or when too
        many subsets were seen. The snapshot itself is kept."""
        self._subs.clear()
        self._snapshots.forget_views()
        self.generation += 1

    def snapshot(self) -> None:
        self._snapshots.take()

    def snapshot_call(self) -> Callable[[], None]:
        """snapshot() as one call (the overlap runner takes one at every step())."""
        return self._snapshots.take

    def _optimizer_for(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        key = tuple(map(id, params))
        sub = self._subs.get(key)
        if sub is None:
            if len(self._subs) >= _MAX_SUBSETS:
                self.invalidate()
            sub = self.subset(params)
            self._subs[key] = sub
        return sub

    def subset(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        """A new sub-optimizer of `params`, not cached here: for a caller that steps the same
        subset every iteration and keeps it, with `generation` to tell when it went stale."""
        return block_optimizer(self._base_cls, self.user, list(params), self._snapshots)

    def slices(self, members: list[list[torch.Tensor]],
               state: collections.defaultdict[torch.Tensor, Any]) -> torch.optim.Optimizer:
        """A sub-optimizer of flat slices of the user's parameters, `members[i]` in param group
        i, keeping their state in `state` (runtime/modes/overlap/piecewise.py)."""
        return grouped_optimizer(self._base_cls, self.user, members, self._snapshots, state)

    def apply(self, params: list[torch.Tensor], grads: list[torch.Tensor] | None = None,
              optimizer: torch.optim.Optimizer | None = None) -> None:
        """Sets the gradients (if given), steps the subset (with `optimizer`, a `subset()` of
        this generation, when given), and clears its gradients so that nothing is left for a
        second step or for the next backward to accumulate into."""
        if grads is not None:
            _C.set_grads(params, grads)
        self.base_step(optimizer if optimizer is not None else self._optimizer_for(params))
        _C.clear_grads(params)

    def step_all_in_two_calls(self) -> list[tuple[int, float | EventSpan, bool]]:
        """Steps every parameter of the user's optimizer that has a gradient, in two calls:
        the smallest one alone, then the rest; gradients are left in place (a synchronous
        step). Each parameter is stepped once, as one call would, so the update is the same;
        the two (bytes, seconds) samples tell a call's fixed cost from its cost per byte."""
        params = [p for group in self.user.param_groups for p in group["params"]
                  if p.grad is not None]
        # GradScaler's scale reaches a fused optimizer as an attribute of the one whose step()
        # it called: a subset would not see it.
        if len(params) < 2 or not self.splittable or "grad_scale" in vars(self.user):
            return []
        self.snapshot()
        smallest = min(range(len(params)), key=lambda i: params[i].numel())
        samples: list[tuple[int, float | EventSpan, bool]] = []
        for subset in ([params[smallest]], params[:smallest] + params[smallest + 1:]):
            optimizer = self._optimizer_for(subset)
            # Device events on CUDA (Note [Which clock]); the call that makes the state told
            # apart (Note [A first call makes the optimizer's state]).
            timer = UpdateTimer(subset, optimizer.state)
            self.base_step(optimizer)
            samples.append((sum(p.numel() * p.element_size() for p in subset), timer.stop(),
                            timer.made_state))
        return samples
