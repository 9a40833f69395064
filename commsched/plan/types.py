"""The data a planner reads (tensor specs, profile, network model) and the plan it returns."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field


class Collective(enum.IntEnum):
    """A block's collective. The codes cross into commsched._C as numbers; importing the
    runtime checks them against the extension's own (runtime.engine.check_collective_codes)."""

    ALLREDUCE = 0
    REDUCE_SCATTER = 1
    ALL_GATHER = 2


class Stage(enum.StrEnum):
    BACKWARD = "backward"  # launched when its gradients are ready
    FORWARD = "forward"  # launched when released just ahead of the next forward pass


@dataclass(frozen=True)
class TensorSpec:
    """One gradient to reduce. `forward_index` is its priority: smaller is needed sooner."""

    tensor_id: int
    name: str
    numel: int
    dtype: str
    element_size: int
    forward_index: int
    group: int | None = None  # Horovod `groups`: members are always reduced in one block

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class Piece:
    tensor_id: int
    offset: int
    numel: int


@dataclass(frozen=True)
class Block:
    block_id: int
    pieces: tuple[Piece, ...]
    dtype: str
    op: Collective = Collective.ALLREDUCE
    stage: Stage = Stage.BACKWARD
    source: int | None = None  # all-gather: block_id of the reduce-scatter it completes


@dataclass(frozen=True)
class UpdateGroup:
    """Parameters (by tensor id) updated by one call of the user's optimizer under an overlap
    plan: in the forward pre-hook of `module`, after the block at plan position `wait_for`."""

    module: str
    tensor_ids: tuple[int, ...]
    wait_for: int


@dataclass(frozen=True)
class Plan:
    policy: str
    blocks: tuple[Block, ...]
    # Overlap plans: how the next forward pass applies the updates (plan/update_groups.py).
    # Empty for synchronous plans, and for overlap plans made before anything was measured.
    update_groups: tuple[UpdateGroup, ...] = ()

    @property
    def fingerprint(self) -> str:
        canonical: list = [self.policy] + [
            [b.block_id, int(b.op), b.stage.value, b.dtype, b.source,
             [[p.tensor_id, p.offset, p.numel] for p in b.pieces]]
            for b in self.blocks
        ]
        if self.update_groups:
            canonical.append([[g.module, list(g.tensor_ids), g.wait_for]
                              for g in self.update_groups])
        return hashlib.sha256(json.dumps(canonical).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class NetModel:
    """Collective time t(n) = alpha + beta * n for n bytes, as measured on this transport."""

    alpha: float = 1e-4
    beta: float = 1e-9

    def time(self, nbytes: int) -> float:
        return self.alpha + self.beta * nbytes


@dataclass(frozen=True)
class Profile:
    """Profiled ready time of each gradient (seconds from the first one of the iteration).

    `ready_times[i]` belongs to tensor id i. An empty profile means nothing was measured yet.
    """

    ready_times: tuple[float, ...] = field(default=())

    @property
    def measured(self) -> bool:
        return len(self.ready_times) > 0
