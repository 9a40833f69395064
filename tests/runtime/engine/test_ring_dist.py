"""The engine's own ring reduce-scatter and all-gather (csrc/ring.h) against torch's collectives
on 2, 3 and 4 Gloo ranks: odd sizes, several chunks, every dtype the engine carries; and DeAR
blocks through an engine that rings them, equal on every rank."""

from __future__ import annotations

import pytest
import torch
from helpers import distributed_test

from commsched.plan import Collective

pytestmark = pytest.mark.processes

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Shard sizes: one element, odd, and more than one 1 MiB chunk (float32: 262,144 per chunk).
SHARDS = (1, 37, 300_001)


def _data(rank: int, numel: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)


def _ring_job() -> list[str]:
    import torch.distributed as dist

    import commsched
    from commsched import _C
    from commsched.torch_compat import all_gather_single, reduce_scatter_single

    world = commsched.init()
    group = dist.new_group(backend="gloo")
    p, rank, problems = world.size, world.rank, []
    for salt, (dtype, shard) in enumerate((d, s) for d in DTYPES for s in SHARDS):
        x = _data(rank, p * shard, dtype, salt)
        ours = torch.empty(shard, dtype=dtype)
        _C.run_collective(group, int(Collective.REDUCE_SCATTER), x, ours, True, 30_000)
        theirs = torch.empty(shard, dtype=dtype)
        reduce_scatter_single(theirs, x.clone(), group)
        # The exact sum in float64, summed the way the ring does: from rank r+1 round to r.
        parts = [_data(q, p * shard, dtype, salt).narrow(0, rank * shard, shard) for q in range(p)]
        ring_order = [parts[(rank + 1 + i) % p] for i in range(p)]
        expect = ring_order[0].clone()
        for part in ring_order[1:]:
            expect = expect + part
        if not torch.equal(ours, expect):
            problems.append(f"rs {dtype} {shard}: not the ring-order sum")
        # Both sums round p - 1 times, in different orders: within 2 p eps of the magnitudes.
        slack = 2 * p * torch.finfo(dtype).eps * sum(q.double().abs() for q in parts)
        if not bool(((ours.double() - theirs.double()).abs() <= slack).all()):
            problems.append(f"rs {dtype} {shard}: differs from torch's reduce_scatter")
        if not torch.equal(x, _data(rank, p * shard, dtype, salt)):
            problems.append(f"rs {dtype} {shard}: the input was written")
        gathered = torch.empty(p * shard, dtype=dtype)
        _C.run_collective(group, int(Collective.ALL_GATHER), ours, gathered, True, 30_000)
        native = torch.empty(p * shard, dtype=dtype)
        all_gather_single(native, ours, group)
        if not torch.equal(gathered, native):
            problems.append(f"ag {dtype} {shard}: differs from torch's all_gather")
        everyone = [torch.empty_like(gathered) for _ in range(p)]
        dist.all_gather(everyone, gathered, group=group)
        if any(not torch.equal(everyone[0], g) for g in everyone):
            problems.append(f"ag {dtype} {shard}: ranks disagree")
    return problems


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ring_collectives_match_torch(ranks: int) -> None:
    results = distributed_test(_ring_job, world_size=ranks, timeout=240)
    assert all(problems == [] for problems in results.values()), results


def _dear_engine_job() -> list[list[float]]:
    import commsched
    from commsched import _C
    from commsched.plan import Collective

    world = commsched.init()
    p = world.size
    names = ["a", "b"]
    results = []
    for ring in (False, True):
        engine = _C.Engine(world.new_data_group(), names, 30_000, ring_collectives=ring)
        pieces = [_C.PieceSpec(tensor_id=0, offset=0, numel=7),
                  _C.PieceSpec(tensor_id=1, offset=0, numel=5)]
        engine.install_plan([
            _C.BlockSpec(block_id=0, op=int(Collective.REDUCE_SCATTER), wire_dtype="float32",
                         prescale=1.0, postscale=1.0, pieces=pieces),
            _C.BlockSpec(block_id=1, op=int(Collective.ALL_GATHER), wire_dtype="float32",
                         prescale=1.0, postscale=1.0 / p, pieces=pieces, source=0)])
        for step in range(2):
            a = torch.arange(7.0) * (world.rank + 1) + step
            b = torch.full((5,), float(world.rank) + 0.5)
            engine.mark_ready(0, a)
            engine.mark_ready(1, b)
            engine.wait_all(30_000)
            results.append(a.tolist() + b.tolist())
        engine.shutdown()
    return results


@pytest.mark.parametrize("ranks", [2, 3])
def test_engine_dear_blocks_with_ring_equal_native(ranks: int) -> None:
    results = distributed_test(_dear_engine_job, world_size=ranks, timeout=120)
    assert all(r == results[0] for r in results.values())  # every rank the same
    native, ring = results[0][:2], results[0][2:]
    assert ring == native  # small integers and halves: every order of summing is exact
    mean_scale = sum(range(1, ranks + 1)) / ranks
    assert native[1] == pytest.approx([i * mean_scale + 1 for i in range(7)] + [ranks / 2] * 5)
