"""What a K-FAC preconditioner makes for the world it runs in: the factor and result exchanges
and the placement of decompositions. Made at construction, or in an elastic Horovod job at the
first use and again whenever that world was re-formed (Note [Elastic K-FAC]).

Note [Elastic K-FAC]
Unlike a compressor's residuals, K-FAC's state is the same on every rank: the running factors
are averaged across ranks and the decompositions shared. So an elastic job keeps it whole: the
preconditioner goes into Horovod's state (``hvd.elastic.TorchState(..., kfac=preconditioner)``;
commsched registers a state handler for it, kfac/elastic.py), a commit copies its state_dict(),
a restore loads it back, and a sync copies rank 0's to every rank, a joining worker included.
Loading in an elastic job first drops the exchanges with their engines (no wait: a peer may be
gone); the next factor hand-over or step() binds to the world of now: the factors' fusion is
profiled again, and the decompositions are placed on the new ranks. At each bind the ranks
compare their step counts: a preconditioner left out of TorchState is neither restored nor
synced, and where that leaves the ranks at different steps (a joining worker starts at 0) it
fails with a MismatchError naming them instead of mixing steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import Config
from ..world import World, bootstrap, check_identical
from . import factors as fx
from .exchange import FactorExchange, ResultExchange
from .placement import Assignment, Placement, assign

log = logging.getLogger("commsched")


@dataclass(frozen=True)
class Layout:
    """What a preconditioner's exchanges carry, whatever the world: the factors in ready order
    with their sizes on the wire, each factor's dimension, and each decomposition's size."""

    order: list[str]
    numels: list[int]
    dims: list[tuple[str, int]]  # (factor, dimension) in layer order, A before G
    result_numels: dict[str, int]
    symmetric: bool


def make_layout(dims: dict[str, int], symmetric: bool, method: fx.ComputeMethod) -> Layout:
    """The layout of factors whose dimensions are `dims` ("<layer>.A" and "<layer>.G", in layer
    order, A before G): A factors are ready in forward order, G factors in backward order."""
    names = list(dims)
    order = names[0::2] + names[1::2][::-1]
    wire = {n: fx.upper_numel(d) if symmetric else d * d for n, d in dims.items()}
    results = {n: d * d + d if method is fx.ComputeMethod.EIGEN else wire[n]
               for n, d in dims.items()}
    return Layout(order, [wire[n] for n in order], list(dims.items()), results, symmetric)


@dataclass
class FactorWorld:
    """A preconditioner's parts for one world."""

    world: World
    pack: bool  # only the upper triangles travel (symmetric factors, more than one rank)
    factors: FactorExchange
    assignment: Assignment
    results: ResultExchange

    @property
    def stale(self) -> bool:
        """Whether an elastic job broke or re-formed this world since it was bound."""
        return bootstrap.outdated(self.world)

    def shutdown(self) -> None:
        self.factors.shutdown()
        self.results.shutdown()


def bind(layout: Layout, like: Callable[[], torch.Tensor], cfg: Config, profile_steps: int,
         placement: Placement, local_threshold: int, steps: int) -> FactorWorld:
    """The parts for the world of now; every rank calls it together. `steps` (the
    preconditioner's count) must be the same on every rank."""
    world = bootstrap.current(cfg.timeout, None)
    check_identical(world, "K-FAC step counts (in an elastic Horovod job pass the "
                    "preconditioner to hvd.elastic.TorchState, which restores and syncs it)",
                    [steps])
    factors = FactorExchange(world, layout.order, layout.numels, like, cfg, profile_steps)
    assignment = assign(layout.dims, world.size, placement, local_threshold)
    log.info("commsched.kfac: %s placement on rank %d: %s", placement.value, world.rank,
             assignment.describe())
    owned = [[(n, layout.result_numels[n]) for n in assignment.owned_by(r)]
             for r in range(world.size)]
    results = ResultExchange(world, owned, like, cfg)
    return FactorWorld(world, layout.symmetric and world.size > 1, factors, assignment, results)
