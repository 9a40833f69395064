"""Reduction ops, numbered as Horovod numbers them so ``hvd.Average`` works here too."""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    AVERAGE = 0
    SUM = 1
    ADASUM = 2


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM


def resolve_op(op: object) -> ReduceOp:
    try:
        resolved = ReduceOp(int(op))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"op={op!r} is not a reduction op: use commsched.Average or "
                         "commsched.Sum") from None
    if resolved is ReduceOp.ADASUM:
        raise ValueError("op=Adasum is not supported by commsched: use Average or Sum")
    return resolved
