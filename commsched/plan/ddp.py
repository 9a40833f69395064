"""PyTorch DDP's gradient buckets.

Before the first iteration, buckets are filled in reverse parameter order (gradients usually
arrive that way): the first bucket holds up to `first_bucket_bytes` (DDP: 1 MiB) so communication
starts early, the rest up to `bucket_bytes` (DDP: 25 MiB), one open bucket per dtype, and a bucket
closes once it reaches its limit. After the first iteration DDP rebuilds the buckets from the
order in which gradients were actually observed; here that order comes from the profile, which
rank 0 broadcasts, so every rank rebuilds identically. Buckets launch strictly in order.
"""

from __future__ import annotations

from ..config import Config
from .types import Block, Profile, TensorSpec
from .units import Unit, blocks_from_unit_lists, units_in_ready_order


def bucket_units(units: list[Unit], first_bucket_bytes: int, bucket_bytes: int) -> list[list[Unit]]:
    closed: list[list[Unit]] = []
    open_buckets: dict[str, tuple[list[Unit], int]] = {}
    closed_per_dtype: dict[str, int] = {}
    for unit in units:
        bucket, size = open_buckets.get(unit.dtype, ([], 0))
        bucket.append(unit)
        size += unit.nbytes
        limit = first_bucket_bytes if closed_per_dtype.get(unit.dtype, 0) == 0 else bucket_bytes
        if size >= limit:
            closed.append(bucket)
            closed_per_dtype[unit.dtype] = closed_per_dtype.get(unit.dtype, 0) + 1
            open_buckets.pop(unit.dtype, None)
        else:
            open_buckets[unit.dtype] = (bucket, size)
    closed.extend(bucket for bucket, _ in open_buckets.values())
    position = {id(u): i for i, u in enumerate(units)}
    # A bucket launches when its first-arriving gradient's bucket turn comes: order by the
    # earliest position of any member, as DDP does.
    return sorted(closed, key=lambda b: min(position[id(u)] for u in b))


def plan_ddp(specs: list[TensorSpec], profile: Profile, cfg: Config) -> tuple[Block, ...]:
    if profile.measured:
        units = units_in_ready_order(specs, profile)
    else:
        units = sorted(units_in_ready_order(specs, profile), key=lambda u: -u.forward_index)
    return blocks_from_unit_lists(bucket_units(units, cfg.first_bucket_bytes, cfg.bucket_bytes))
