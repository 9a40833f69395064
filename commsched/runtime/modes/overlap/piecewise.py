"""An update group's update applied piece by piece, as its partitions land.

Note [A large group is updated piece by piece]
Under a cross-iteration plan, a group's update waits in the next forward pass for the group's
last block and then runs as one optimizer call. When the group holds a tensor that travels in
many partitions (VGG-16's first classifier layer: 411 MB in 2 MiB blocks), that call is memory
bound and sits on the critical cycle: the forward pass cannot go on until it ends, and the link
idles meanwhile (benchmarks/real/vgg16-6gbit/critical_cycle.md). The training thread spends the
transfer waiting anyway, so the group is cut into pieces of at least PIECE_BYTES in plan order:
the runner waits for one piece's blocks, steps that piece, then waits for the next, and only the
last piece's step is left after the last block.

A piece steps flat slices of its parameters with the user's optimizer class (the sharded
optimizer's way, runtime/modes/shard_state.py): exact for torch.optim's element-wise optimizers,
each
element updated from its own gradient and state. Unlike the sharded state, the state stays the
user's: a slice's element-wise state tensors are views into the user's, updated in place, and
its scalars (Adam's step) are copies refreshed before each application and written back after,
so ``state_dict()`` and a whole update afterwards see one state. A group is stepped whole
instead when it is small (the calls' fixed cost would outweigh what they hide), when the class
is not element-wise, or while a parameter has no state yet or state of another shape (the first
update creates it whole; SGD without momentum keeps none, and its update is cheap anyway).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ....plan.pieces import UpdatePiece
from ...deferred import DeferredUpdates
from ..shard_state import ELEMENTWISE


class PiecewiseUpdate:
    """One group's update in pieces (Note [A large group is updated piece by piece]): the
    slices, their state views and one sub-optimizer per piece, made when first needed and again
    when the user's state or the deferred updates' generation changed."""

    def __init__(self, deferred: DeferredUpdates, pieces: tuple[UpdatePiece, ...],
                 params: Sequence[torch.Tensor]) -> None:
        self._deferred = deferred
        self._pieces = pieces
        self._params = list(params)  # by slot
        self._usable = deferred.base_cls in ELEMENTWISE and deferred.splittable
        self._slots = sorted({slot for piece in pieces for slot, _, _ in piece.ranges})
        # What the slices were cut from, for the identity check at each application.
        self._cut_from: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._generation = -1
        self._views: list[list[tuple[int, int, int, torch.Tensor]]] = []  # per piece
        self._subs: list[torch.optim.Optimizer] = []
        self._state: collections.defaultdict[torch.Tensor, dict[str, Any]] = \
            collections.defaultdict(dict)

    def apply(self, grads: Sequence[torch.Tensor | None], wait_block: Callable[[int], None],
              timed: Callable[[list[torch.Tensor], int, Callable[[], Any]], None]) -> bool:
        """Waits for each piece's blocks and steps it; False (nothing done) where the group
        must be stepped whole.

        Args:
            grads: the taken gradients, by slot.
            wait_block: waits for the block at a plan position.
            timed: runs one update call (slices, bytes, the call), timing it.

        Returns:
            Whether the group was updated here.
        """
        if not self._usable or any(grads[slot] is None for slot in self._slots) \
                or not self._current():
            return False  # a parameter without a gradient is left to the optimizer's own rule
        self._refresh_scalars()
        step = self._deferred.base_step
        for piece, views, sub in zip(self._pieces, self._views, self._subs, strict=True):
            for position in piece.waits:
                wait_block(position)
            slices = [view for _, _, _, view in views]
            for slot, start, stop, view in views:
                grad = grads[slot]
                assert grad is not None  # checked above
                view.grad = grad.view(-1)[start:stop]
            timed(slices, sum(v.numel() * v.element_size() for v in slices),
                  functools.partial(step, sub))
            for view in slices:
                view.grad = None
        self._write_back_scalars()
        return True

    def _current(self) -> bool:
        """Whether the slices can step now, cutting them again where the state moved on."""
        user_state = self._deferred.user.state
        entries = [user_state.get(self._params[slot]) for slot in self._slots]
        if self._generation == self._deferred.generation and len(entries) == len(self._cut_from) \
                and all(e is cut and _same_values(e, values) for e, (cut, values)
                        in zip(entries, self._cut_from, strict=True)):
            return True
        if not all(e and _element_wise(e, self._params[slot])
                   for e, slot in zip(entries, self._slots, strict=True)):
            return False
        self._cut(entries)
        return True

    def _cut(self, entries: list[Any]) -> None:
        entry_of = dict(zip(self._slots, entries, strict=True))
        self._cut_from = [(e, dict(e)) for e in entries]
        self._state = collections.defaultdict(dict)
        self._views = []
        for piece in self._pieces:
            views = []
            for slot, start, stop in piece.ranges:
                view = self._params[slot].detach().view(-1)[start:stop]
                self._state[view] = {k: _slice(v, start, stop) for k, v in entry_of[slot].items()}
                views.append((slot, start, stop, view))
            self._views.append(views)
        groups = self._deferred.user.param_groups
        group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
        self._subs = []
        for views in self._views:
            members: list[list[torch.Tensor]] = [[] for _ in groups]
            for slot, _, _, view in views:
                members[group_of[id(self._params[slot])]].append(view)
            self._subs.append(self._deferred.slices(members, self._state))
        self._generation = self._deferred.generation

    def _refresh_scalars(self) -> None:
        for piece_views in self._views:
            for slot, _, _, view in piece_views:
                _copy_scalars(self._deferred.user.state[self._params[slot]], self._state[view])

    def _write_back_scalars(self) -> None:
        """Each parameter's scalars from its slice stepped last (every slice counts the same)."""
        last = {slot: view for piece_views in self._views for slot, _, _, view in piece_views}
        for slot, view in last.items():
            _copy_scalars(self._state[view], self._deferred.user.state[self._params[slot]])


def _sliced(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _copied(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _copy_scalars(source: dict[str, Any], target: dict[str, Any]) -> None:
    """The values of `source` that are not element-wise tensors, copied into `target`."""
    for key, value in source.items():
        if not _sliced(value):
            target[key] = _copied(value)


def _slice(value: Any, start: int, stop: int) -> Any:
    """A state value as a slice's: an element-wise tensor as a view, the rest copied."""
    return value.view(-1)[start:stop] if _sliced(value) else _copied(value)


def _element_wise(entry: dict[str, Any], param: torch.Tensor) -> bool:
    """Whether every tensor of a state entry is the parameter's shape (or a scalar) and
    contiguous, so that a slice of it is a view."""
    return all(not _sliced(v) or (v.shape == param.shape and v.is_contiguous())
               for v in entry.values())


def _same_values(entry: dict[str, Any], cut: dict[str, Any]) -> bool:
    """Whether an entry still holds the element-wise tensors the slices view."""
    return entry.keys() == cut.keys() and all(
        entry[k] is cut[k] for k in entry if _sliced(entry[k]))
