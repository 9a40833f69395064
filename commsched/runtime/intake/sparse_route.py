"""Sparse gradients without ``sparse_as_dense``: Horovod 0.28.1's reduction, rank-safe.

Horovod all-gathers a sparse gradient's indices and values from every rank, divides the values
by the world size for Average, and hands the optimizer the uncoalesced concatenation (duplicate
rows are summed when the optimizer coalesces). We do the same, with two differences that keep
every rank's collectives in the same order:

* Which parameters take this route is decided at wrap time, identically on every rank, from the
  model: parameters of modules with a true ``sparse`` attribute (``nn.Embedding``,
  ``nn.EmbeddingBag``). They are left out of the engine's dense plan, so no bytes are wasted.
  Horovod decides per gradient at run time, so a rank that did not use the embedding sends a
  dense all-reduce while the others all-gather: a hang. Here such a rank contributes zero rows.
* The exchange runs on a process group of its own (never the engine's, whose thread may be
  mid-collective), from the training thread, at ``synchronize()`` / ``step()``.

Sizes differ across ranks, so the row counts are all-gathered first and every rank pads to the
largest; every wait is bounded by the group's timeout.

Without ``model=`` nothing tells commsched before training which parameters are sparse: their
gradients are then reduced dense and handed back sparse (Note [sparse gradients without a route]
in runtime/intake/gradient_intake.py), as Horovod's ``sparse_as_dense=True`` does.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...ops import ReduceOp
from ...world import World, registry
from ...world.errors import without_backtrace
from ..deferred import DeferredUpdates


def sparse_parameter_ids(model: Any, sparse_as_dense: bool) -> set[int]:
    """id() of every parameter owned by a module that declares ``sparse=True``."""
    if sparse_as_dense or not isinstance(model, nn.Module):
        return set()
    return {id(p) for m in model.modules() if getattr(m, "sparse", False) is True
            for p in m.parameters(recurse=False)}


def _row_sparse(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    """The gradient as COO with one sparse dimension (what nn.Embedding produces), so that
    indices and values have the same trailing shape on every rank whatever each rank holds."""
    if grad is None:
        return torch.sparse_coo_tensor(
            torch.zeros(1, 0, dtype=torch.long, device=param.device),
            torch.zeros(0, *param.shape[1:], dtype=param.dtype, device=param.device), param.shape)
    if not grad.is_sparse:  # e.g. a weight tied to a dense layer as well
        return grad.to_sparse(1)
    if grad.sparse_dim() != 1:
        return grad.to_dense().to_sparse(1)
    return grad


class SparseExchange:
    """The sparse-routed parameters of one wrapped optimizer and their all-gather."""

    def __init__(self, world: World, named: list[tuple[str, torch.Tensor]], op: ReduceOp,
                 passes: int) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._world = world
        self._op = op
        self._timeout = datetime.timedelta(seconds=world.timeout)
        # Every rank calls this at wrap time with the same list (it is part of the settings
        # every rank compares), so group creation itself stays in step.
        self._group = world.new_data_group() if named and world.size > 1 else None
        self.delay = [passes] * len(named)

    def close(self) -> None:
        """Destroys the route's group (a second call, or one after commsched.shutdown()
        destroyed every group, does nothing)."""
        group, self._group = self._group, None
        if group is None or not dist.is_initialized():
            return
        with contextlib.suppress(ValueError):  # already gone with the world it belonged to
            dist.destroy_process_group(group)

    def __len__(self) -> int:
        return len(self.params)

    def reset(self, passes: int) -> None:
        self.delay = [passes] * len(self.params)

    def pending(self, passes: int) -> bool:
        return any(d != passes for d in self.delay)

    # -- the exchange ---------------------------------------------------------------------------

    def _wait(self, work: Any, what: str) -> None:
        # The heartbeats say "in a collective" meanwhile: peers waiting on this rank then do not
        # take it for one stuck outside any.
        activity = registry.activity
        previous = activity.now
        activity.now = ("collective", time.monotonic(), previous[2] if previous else 0)
        try:
            work.wait(self._timeout)
        except RuntimeError as err:
            liveness = getattr(self._world, "liveness", None)
            verdict = (liveness.diagnose(ranks=self._world.members).text
                       if liveness is not None else "")
            raise self._world.fail(f"{verdict + ': ' if verdict else ''}commsched: all-gather "
                                   f"of sparse gradient {what} failed: {without_backtrace(err)}"
                                   ) from None  # its text holds err's, without the C++ frames
        finally:
            activity.now = previous

    def _all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self._world.size)]
        self._wait(dist.all_gather(out, tensor, group=self._group, async_op=True), what)
        return out

    def exchange(self) -> None:
        """Replaces each routed parameter's ``grad`` by the all-gathered sparse gradient."""
        if not self.params or self._world.size == 1:
            return  # a world of one: the local gradient is already the average
        grads = [_row_sparse(p.grad, p) for p in self.params]
        counts = torch.tensor([g._nnz() for g in grads], dtype=torch.long,
                              device=self.params[0].device)
        per_rank = torch.stack(self._all_gather(counts, "row counts")).tolist()
        for i, (name, param, grad) in enumerate(zip(self.names, self.params, grads, strict=True)):
            rows = [per_rank[r][i] for r in range(self._world.size)]
            param.grad = self._gather_one(name, param, grad, rows)

    def _gather_one(self, name: str, param: torch.Tensor, grad: torch.Tensor,
                    rows: list[int]) -> torch.Tensor:
        top = max(rows)
        indices, values = grad._indices(), grad._values()
        if top == 0:
            return torch.sparse_coo_tensor(indices, values, param.shape)
        pad = top - indices.shape[1]
        # Padded to the largest count: Gloo and NCCL all-gather equal sizes only.
        indices = nn.functional.pad(indices, (0, pad)).contiguous()
        values = torch.cat([values, values.new_zeros(pad, *values.shape[1:])]).contiguous()
        all_indices = self._all_gather(indices, f"'{name}' (indices)")
        all_values = self._all_gather(values, f"'{name}' (values)")
        # Rank order, as Horovod's all-gather concatenates: the optimizer then sums duplicate
        # rows in the same order, bit for bit.
        indices = torch.cat([t[:, :n] for t, n in zip(all_indices, rows, strict=True)], dim=1)
        values = torch.cat([t[:n] for t, n in zip(all_values, rows, strict=True)])
        if self._op is ReduceOp.AVERAGE:
            # Horovod divides after the gather and ignores gradient_predivide_factor here: a
            # concatenation sums nothing on the wire, so there is nothing to pre-divide against.
            values = values / self._world.size
        return torch.sparse_coo_tensor(indices, values, param.shape)

    # -- overlap policies -----------------------------------------------------------------------

    def step_now(self, deferred: DeferredUpdates) -> None:
        """Applies the routed parameters' update at once, with the user's optimizer restricted
        to them: the overlap policies defer only the dense blocks to the next forward pass."""
        params = [p for p in self.params if p.grad is not None]
        if params:
            deferred.snapshot()  # the hyper-parameters as they are at this step()
            deferred.apply(params)
