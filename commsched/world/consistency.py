"""Cross-rank agreement: every rank must wrap the same model and run the identical plan.

Each check all-gathers a short digest first; only on a mismatch are the full descriptions
gathered, so every rank raises the same error naming the first difference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ..plan import TensorSpec
from .errors import MismatchError
from .view import World


def digest(items: Any) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()


def parameter_signature(specs: Sequence[TensorSpec], shapes: Sequence[tuple[int, ...]]) -> list:
    return [[s.name, list(shape), s.dtype] for s, shape in zip(specs, shapes, strict=True)]


def first_difference(reference: list, other: list) -> tuple[int, Any, Any]:
    for index, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return index, a, b
    index = min(len(reference), len(other))
    def pick(seq):
        return (seq[index] if index < len(seq) else "<nothing>")
    return index, pick(reference), pick(other)


def check_identical(world: World, what: str, items: list) -> None:
    """Raises MismatchError on every rank when `items` differ between ranks."""
    if world.size == 1:
        return
    digests = world.all_gather_object(digest(items))
    if len(set(digests)) == 1:
        return
    everything = world.all_gather_object(items)
    for rank in range(1, world.size):
        if digests[rank] != digests[0]:
            index, ours, theirs = first_difference(everything[0], everything[rank])
            raise MismatchError(
                f"commsched: {what} differ across ranks: first difference at entry {index}: "
                f"rank 0 has {ours!r}, rank {rank} has {theirs!r}")
