"""Reduction ops, numbered as Horovod numbers them so ``hvd.Average`` works here too."""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """How DistributedOptimizer's ``op=`` combines the ranks' gradients, and allreduce()'s values.

    ``Average`` (the default) is the mean over ranks, ``Sum`` the sum; ``Adasum`` exists for
    Horovod's numbering only and is refused. The values are Horovod's, so ``hvd.Average`` and
    ``hvd.Sum`` work as ``op=`` too.
    """

    AVERAGE = 0
    SUM = 1
    ADASUM = 2


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM


def resolve_op(op: object) -> ReduceOp:
    """The ReduceOp that `op` (ours, or Horovod's number) stands for.

    Raises:
        ValueError: `op` is no reduction op, or is Adasum, which commsched does not support.
    """
    try:
        resolved = ReduceOp(int(op))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"op={op!r} is not a reduction op: use commsched.Average or "
                         "commsched.Sum") from None
    if resolved is ReduceOp.ADASUM:
        raise ValueError("op=Adasum is not supported by commsched: use Average or Sum")
    return resolved
