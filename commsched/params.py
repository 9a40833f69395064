"""Validation of what DistributedOptimizer is given (names, groups), with Horovod's errors."""

from __future__ import annotations

import gc
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.modules.module import register_module_module_registration_hook
from torch.nn.parallel import DistributedDataParallel

_REDUCED_TWICE = (
    "which all-reduces every gradient itself in backward: commsched would reduce them a second "
    "time. Drop one of the two: pass the module inside it (`ddp_model.module`) as model= and "
    "its parameters, and let commsched reduce, or keep DDP with the plain optimizer")


# Note [Finding DDP wrappers]
# A DistributedDataParallel wrapper reduces every gradient of its module in backward, so an
# optimizer over those parameters must be refused, even when only the parameters are given.
# Nothing on a parameter says that DDP holds it: the wrappers are found from the other side.
# Every wrapper assigns its module in __init__ (`self.module = module`), which passes through
# torch's module-registration hook common to all modules: registered when this module is
# imported, it keeps each wrapper made from then on in a weak set. Wrappers made before the
# import are found once, by one scan of the heap at the first check that needs it. That scan
# reads every object of the process (hundreds of thousands once torch is imported, twice as
# many with dynamo), which every DistributedOptimizer used to pay. In the scan type(), not
# isinstance(): isinstance() asks a dead weak proxy for its class and raises. The hook sees
# only modules, for which isinstance() is safe.
class _DataParallelWrappers:
    """Every live DistributedDataParallel of this process (Note [Finding DDP wrappers])."""

    def __init__(self) -> None:
        self._made: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._heap_scanned = False  # the wrappers made before this module was imported
        register_module_module_registration_hook(self._on_register)

    def _on_register(self, parent: torch.nn.Module, name: str,
                     child: torch.nn.Module | None) -> None:
        if isinstance(parent, DistributedDataParallel):
            self._made.add(parent)

    def live(self) -> list[torch.nn.Module]:
        if not self._heap_scanned:
            heap = gc.get_objects()
            kinds = set(map(type, heap)) & _subclasses(DistributedDataParallel)
            if kinds:
                self._made.update(obj for obj in heap if type(obj) in kinds)
            self._heap_scanned = True
        return list(self._made)


def _subclasses(cls: type) -> set[type]:
    """`cls` and every class derived from it, however indirectly."""
    found, pending = {cls}, [cls]
    while pending:
        sub: type
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    return found


_WRAPPERS = _DataParallelWrappers()


def refuse_data_parallel(model: torch.nn.Module | None, params: list[torch.Tensor]) -> None:
    """Raises ValueError where `model`, or the module holding `params`, is wrapped in DDP.

    Such a wrapper exists only beside an initialised process group, so without one nothing is
    looked for (Note [Finding DDP wrappers]).
    """
    if model is not None:
        inside = [name or "the model" for name, module in model.named_modules()
                  if isinstance(module, DistributedDataParallel)]
        if inside:
            raise ValueError(f"commsched: model= is (or holds, as {inside[0]!r}) torch's "
                             f"DistributedDataParallel, {_REDUCED_TWICE}")
    if not (dist.is_available() and dist.is_initialized()):
        return
    ids = {id(p) for p in params}
    for wrapper in _WRAPPERS.live():
        module = cast(torch.nn.Module, wrapper.module)
        if any(id(p) in ids for p in module.parameters()):
            raise ValueError("commsched: the parameters given to DistributedOptimizer belong to "
                             "a module wrapped in torch's DistributedDataParallel, "
                             + _REDUCED_TWICE)


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def resolve_names(optimizer: torch.optim.Optimizer,
                  named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                  ) -> list[tuple[str, torch.Tensor]]:
    """Named parameters in the order the model declared them (our forward order)."""
    params = optimizer_params(optimizer)
    if named_parameters is None:
        return [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    counts = Counter(name for name, _ in named)
    dups = sorted(name for name, count in counts.items() if count > 1)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(dups))
    named_ids = {id(p) for _, p in named}
    unnamed = [id(p) for p in params if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: " + ", ".join(map(str, unnamed)))
    in_optimizer = {id(p) for p in params}
    unique: dict[int, tuple[str, torch.Tensor]] = {}
    for name, p in named:
        if id(p) in in_optimizer and id(p) not in unique:
            unique[id(p)] = (name, p)
    return list(unique.values())


def _split_evenly(items: list[torch.Tensor], parts: int) -> list[list[torch.Tensor]]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [chunk for chunk in out if chunk]


def resolve_groups(params: list[torch.Tensor], num_groups: int, groups: Any) -> dict[int, int]:
    """Maps id(param) to its group index (Horovod's `groups` / deprecated `num_groups`)."""
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None or groups == 0:
        return {}
    if isinstance(groups, bool) or not isinstance(groups, (int, list)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        lists = _split_evenly(params, groups)
    else:
        if not all(isinstance(g, (list, tuple)) and all(isinstance(p, torch.Tensor) for p in g)
                   for g in groups):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        lists = [list(g) for g in groups]
    mapping: dict[int, int] = {}
    for index, members in enumerate(lists):
        for p in members:
            if id(p) in mapping:
                raise ValueError("a parameter appears in more than one group of `groups`")
            mapping[id(p)] = index
    return mapping
