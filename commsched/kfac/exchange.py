"""K-FAC's traffic on engines of its own: factor averaging and the sharing of decompositions.

Factors are all-reduced as soon as the hooks hand them over, in blocks fused by the mgwfbp rule
from the profiled factor-ready times (the first `profile_steps` factor updates run one block per
factor to measure them). Decompositions computed on one rank reach the others by one standalone
all-gather: rank r writes its results into the r-th equal slice of a shared buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..compression import Compression
from ..config import Config, Policy
from ..plan import (
    Block,
    Collective,
    Piece,
    Plan,
    Profile,
    TensorSpec,
    dtype_name,
    make_plan,
    make_profiling_plan,
    plan_from_dict,
    plan_to_dict,
)
from ..runtime.engine.handle import EngineHandle
from ..world import World, check_identical

log = logging.getLogger("commsched")

SEEN = "kfac.seen"


class FactorExchange:
    """Averages one factor update across ranks. `names` is the expected ready order (A factors
    in forward order, then G factors in backward order)."""

    def __init__(self, world: World, names: list[str], numels: list[int],
                 like: Callable[[], torch.Tensor], cfg: Config, profile_steps: int) -> None:
        self.world = world
        self.cfg = cfg
        self.profile_steps = profile_steps
        dtype = like().dtype
        self.like = like  # an empty tensor of the factors' dtype, on the model's present device
        self.factor_names = list(names)
        # The last tensor counts, per factor, the ranks that computed it this update: a layer
        # that did not run on some rank must not be averaged with zeros.
        names, numels = [*names, SEEN], [*numels, len(names)]
        self.index = {name: i for i, name in enumerate(names)}
        # Empty profiles order tensors by descending forward_index: make that the ready order.
        self.specs = [TensorSpec(i, name, numel, dtype_name(dtype), dtype.itemsize,
                                 forward_index=len(names) - 1 - i)
                      for i, (name, numel) in enumerate(zip(names, numels, strict=True))]
        self.updates = 0
        self.verify_plan = False
        self.submitted: dict[str, torch.Tensor] = {}
        self.engine = EngineHandle(world, self.specs, cfg.timeout) if world.size > 1 else None
        if self.engine is not None:
            self.engine.label = "K-FAC factors"  # in a failed wait's diagnosis
            first = (make_profiling_plan(self.specs, Profile()) if profile_steps > 0 else
                     make_plan(Policy.MGWFBP, self.specs, Profile(),
                               self.engine.profiler.net_model(cfg.alpha, cfg.beta), cfg))
            self._install(first)

    def _install(self, plan: Plan, check_now: bool = True) -> None:
        assert self.engine is not None
        if check_now:
            check_identical(self.world, "K-FAC factor plan fingerprints",
                            [plan.policy, plan.fingerprint])
        self.engine.install(plan, Compression.none, 1.0, 1.0 / self.world.size)

    @property
    def plan(self) -> Plan | None:
        return self.engine.plan if self.engine is not None else None

    def submit(self, name: str, flat: torch.Tensor) -> None:
        assert name not in self.submitted, f"factor {name} handed over twice in one update"
        if self.verify_plan and self.engine is not None and self.engine.plan is not None:
            self.verify_plan = False
            check_identical(self.world, "K-FAC factor plan fingerprints (restored)",
                            [self.engine.plan.policy, self.engine.plan.fingerprint])
        self.submitted[name] = flat
        if self.engine is not None:
            self.engine.mark_ready(self.index[name], flat)

    def finish(self) -> dict[str, torch.Tensor | None]:
        """Waits for this update's averages over the ranks that computed each factor; None for
        a factor no rank computed. Collective: every rank calls it on every factor update, with
        zeros for what it did not compute, so no rank waits for another's skipped update."""
        seen = self.like().new_tensor([float(n in self.submitted) for n in self.factor_names])
        for spec in self.specs[:-1]:
            if spec.name not in self.submitted:
                self.submit(spec.name, self.like().new_zeros(spec.numel))
        self.submit(SEEN, seen)
        averaged, self.submitted = self.submitted, {}
        if self.engine is not None:
            self.engine.wait()
            self.updates += 1
            if self.updates == self.profile_steps:
                self._replan()
        share = averaged.pop(SEEN)  # fraction of ranks that computed each factor
        return {name: averaged[name] / float(share[i]) if float(share[i]) > 0 else None
                for i, name in enumerate(self.factor_names)}

    def _replan(self) -> None:
        assert self.engine is not None
        profiler = self.engine.profiler
        profile, net = self.world.broadcast_object(
            (profiler.profile(), profiler.net_model(self.cfg.alpha, self.cfg.beta)))
        plan = make_plan(Policy.MGWFBP, self.specs, profile, net, self.cfg)
        log.info("commsched.kfac: factor plan %s: %d blocks for %d factors (alpha=%.3g s, "
                 "beta=%.3g s/B)", plan.fingerprint, len(plan.blocks), len(self.specs), net.alpha,
                 net.beta)
        self._install(plan)

    def state(self) -> dict[str, Any]:
        plan = self.plan
        return {"updates": self.updates, "plan": None if plan is None else plan_to_dict(plan)}

    def restore(self, state: dict[str, Any]) -> None:
        """Re-installs a checkpoint's factor plan, so that a resumed run neither profiles again
        nor fuses differently (with 3+ ranks, fusion boundaries change the float sums). Local, as
        the wrapped optimizer's restore is: the cross-rank fingerprint check runs at the next
        factor hand-over, before any factor collective (every rank loads its checkpoint)."""
        self.updates = int(state["updates"])
        if self.engine is None or state["plan"] is None:
            return
        plan = plan_from_dict(state["plan"])
        known = {spec.tensor_id: spec.numel for spec in self.specs}
        covered = [(p.tensor_id, p.offset + p.numel) for b in plan.blocks for p in b.pieces]
        if any(t not in known or end > known[t] for t, end in covered):
            raise ValueError("commsched.kfac: the checkpoint's factor plan does not fit this "
                             "model's factors")
        self._install(plan, check_now=False)
        self.verify_plan = True

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class ResultExchange:
    """Shares the decompositions each rank owns; `owned[r]` lists (name, numel) of rank r's."""

    def __init__(self, world: World, owned: list[list[tuple[str, int]]],
                 like: Callable[[], torch.Tensor], cfg: Config) -> None:
        self.world = world
        self.like = like
        dtype = like().dtype
        self.slice = max([sum(n for _, n in names) for names in owned] + [1])
        self.where: dict[str, tuple[int, int]] = {}
        for rank, names in enumerate(owned):
            offset = rank * self.slice
            for name, numel in names:
                self.where[name] = (offset, numel)
                offset += numel
        total = self.slice * world.size
        self.engine = None
        if world.size > 1 and self.where:
            spec = TensorSpec(0, "kfac.decompositions", total, dtype_name(dtype), dtype.itemsize, 0)
            self.engine = EngineHandle(world, [spec], cfg.timeout)
            self.engine.label = "K-FAC decompositions"
            block = Block(0, (Piece(0, 0, total),), dtype_name(dtype), op=Collective.ALL_GATHER)
            plan = Plan("kfac-decompositions", (block,))
            check_identical(world, "K-FAC decomposition layout", [plan.fingerprint, self.slice])
            self.engine.install(plan, Compression.none, 1.0, 1.0)

    def share(self, mine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every rank's results, from this rank's (name -> flat tensor)."""
        if self.engine is None:
            return dict(mine)
        buffer = self.like().new_zeros(self.slice * self.world.size)
        for name, flat in mine.items():
            offset, numel = self.where[name]
            buffer[offset:offset + numel] = flat
        self.engine.mark_ready(0, buffer)
        self.engine.wait()
        return {name: buffer[offset:offset + numel] for name, (offset, numel) in self.where.items()}

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
