"""Splitting tensors into partitions, the unit ByteScheduler and Prophet schedule."""

from __future__ import annotations

from dataclasses import dataclass

from .types import Piece, Profile, TensorSpec
from .units import ready_time


@dataclass(frozen=True)
class Partition:
    spec: TensorSpec
    offset: int
    numel: int
    ready: float

    @property
    def nbytes(self) -> int:
        return self.numel * self.spec.element_size

    @property
    def priority(self) -> tuple[int, int]:
        """Front layers first (they are needed first in the next forward pass)."""
        return (self.spec.forward_index, self.offset)

    @property
    def piece(self) -> Piece:
        return Piece(self.spec.tensor_id, self.offset, self.numel)


def partition(specs: list[TensorSpec], profile: Profile, partition_bytes: int) -> list[Partition]:
    parts = []
    for spec in specs:
        if spec.numel == 0:
            continue
        step = max(1, partition_bytes // spec.element_size)
        for offset in range(0, spec.numel, step):
            parts.append(Partition(spec, offset, min(step, spec.numel - offset),
                                   ready_time(spec, profile)))
    return parts
