"""The C++ engine on real Gloo ranks: partitions, dtypes, plan order, timeouts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test

from commsched import _C
from commsched.plan import Collective

pytestmark = pytest.mark.processes

AR, RS, AG = Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER


def _block(block_id: int, op: Collective, pieces: list[tuple[int, int, int]], *,
           wire: str = "float32", pre: float = 1.0, post: float = 1.0, released: bool = False,
           source: int = -1) -> _C.BlockSpec:
    return _C.BlockSpec(block_id=block_id, op=int(op), wire_dtype=wire, prescale=pre,
                        postscale=post, released_by_caller=released, source=source,
                        pieces=[_C.PieceSpec(tensor_id=t, offset=o, numel=n) for t, o, n in pieces])


def _partition_job() -> dict:
    import commsched
    from commsched import _C

    world = commsched.init()
    rank = world.rank
    engine = _C.Engine(world.process_group, ["a", "b", "c"], 20_000)
    half = 1.0 / world.size
    engine.install_plan([
        _block(0, AR, [(0, 2, 3), (1, 0, 4)], post=half),
        _block(1, AR, [(0, 0, 2)], post=half),
        _block(2, AR, [(2, 0, 3)], wire="float16", pre=2.0, post=half / 2.0),  # fp64 on fp16
    ])
    out: dict[int | str, Any] = {}  # per iteration, and what the engine reported
    for iteration in range(2):
        a = torch.arange(5.0) * (rank + 1) + iteration
        b = torch.full((2, 2), float(rank))
        c = torch.ones(3, dtype=torch.float64) * (rank + 1)
        # Ready in reverse plan order: launches must still follow plan order.
        engine.mark_ready(2, c)
        engine.mark_ready(1, b)
        engine.mark_ready(0, a)
        engine.wait_all(20_000)
        out[iteration] = (a.tolist(), b.flatten().tolist(), c.tolist())
    timings = engine.last_block_timings()
    out["launch_order"] = [t[0] for t in sorted(timings, key=lambda t: t[3])]
    try:
        engine.mark_ready(0, torch.zeros(5))
        engine.mark_ready(0, torch.zeros(5))
    except RuntimeError as err:
        out["twice"] = str(err)
    engine.shutdown()
    return out


def test_partitioned_blocks_average_across_ranks() -> None:
    results = distributed_test(_partition_job, world_size=3, timeout=90)
    size = 3
    mean_factor = sum(r + 1 for r in range(size)) / size
    for out in results.values():
        for iteration in range(2):
            a, b, c = out[iteration]
            expected_a = [(i * mean_factor) + iteration for i in range(5)]
            assert torch.allclose(torch.tensor(a), torch.tensor(expected_a), atol=1e-5)
            assert b == [sum(range(size)) / size] * 4
            assert torch.allclose(torch.tensor(c, dtype=torch.float64),
                                  torch.full((3,), mean_factor, dtype=torch.float64),
                                  atol=1e-3)
        assert out["launch_order"] == [0, 1, 2]
        assert "'a' was marked ready twice" in out["twice"]


def _timeout_job() -> str:
    import commsched
    from commsched import _C

    world = commsched.init()
    engine = _C.Engine(world.process_group, ["first", "second"], 3000)
    engine.install_plan([_block(0, AR, [(0, 0, 4)]), _block(1, AR, [(1, 0, 4)])])
    engine.mark_ready(0, torch.ones(4))
    if world.rank == 0:
        engine.mark_ready(1, torch.ones(4))
    try:
        engine.wait_all(3000)
    except RuntimeError as err:
        return str(err)
    finally:
        engine.shutdown()
    return "no error"


def test_timeout_names_blocks_and_missing_tensors() -> None:
    results = distributed_test(_timeout_job, world_size=2, timeout=60,
                               env={"COMMSCHED_TIMEOUT": "3"})
    # Rank 1 never produced 'second': its error names the tensor; rank 0 launched block 1 and
    # its collective cannot finish without rank 1.
    assert "block 1" in results[1] and "'second'" in results[1]
    assert "COMMSCHED_TIMEOUT" in results[1]
    assert "block 1" in results[0]


def _decoupled_job() -> dict:
    """DeAR's shape: reduce-scatter in backward, all-gather released later by the caller."""
    import commsched
    from commsched import _C

    world = commsched.init()
    rank, size = world.rank, world.size
    engine = _C.Engine(world.process_group, ["w1", "w2", "b"], 20_000)
    engine.set_credit(8)  # smaller than any block: one block in flight at a time
    avg = 1.0 / size
    engine.install_plan([
        _block(0, RS, [(0, 0, 5), (1, 0, 2)]),  # 7 elements: padded to the world size
        _block(1, AR, [(2, 0, 3)], post=avg),
        _block(2, AG, [(0, 0, 5), (1, 0, 2)], post=avg, released=True, source=0),
    ])
    w1, w2, b = (torch.full((5,), float(rank + 1)), torch.arange(2.0) * (rank + 1),
                 torch.full((3,), 10.0 * rank))
    for tid, grad in ((2, b), (1, w2), (0, w1)):
        engine.mark_ready(tid, grad)
    engine.wait_block(1, 20_000)  # reduce-scatter and allreduce done, all-gather not released
    out: dict[str, Any] = {"b": b.tolist(), "w1_before_gather": w1.tolist()}
    engine.release(2)
    engine.wait_all(20_000)
    out.update(w1=w1.tolist(), w2=w2.tolist())
    try:
        engine.release(1)
    except RuntimeError as err:
        out["bad_release"] = str(err)
    engine.shutdown()
    return out


def test_reduce_scatter_all_gather_release_and_credit() -> None:
    size = 3
    results = distributed_test(_decoupled_job, world_size=size, timeout=90)
    mean = sum(r + 1 for r in range(size)) / size
    for rank, out in results.items():
        assert out["b"] == pytest.approx([10.0 * sum(range(size)) / size] * 3)
        assert out["w1_before_gather"] == [float(rank + 1)] * 5  # untouched until all-gather
        assert out["w1"] == pytest.approx([mean] * 5)
        assert out["w2"] == pytest.approx([0.0, mean])
        assert "not a forward-stage block" in out["bad_release"]


def _standalone_gather_job() -> dict:
    """A standalone all-gather (no reduce-scatter source) over a 2-piece block of 7 elements on
    3 ranks: padded to 9, rank r sends elements [3r, 3r+3) of the packed block."""
    import commsched
    from commsched import _C

    world = commsched.init()
    rank = world.rank
    engine = _C.Engine(world.process_group, ["x", "y"], 20_000)
    engine.install_plan([_block(0, AG, [(0, 0, 4), (1, 0, 3)])])
    x = torch.full((4,), -1.0)
    y = torch.full((3,), -1.0)
    packed = torch.cat([x, y, torch.zeros(2)])
    mine = slice(3 * rank, 3 * rank + 3)
    packed[mine] = torch.arange(3.0) + 10 * rank
    x.copy_(packed[:4])
    y.copy_(packed[4:7])
    engine.mark_ready(0, x)
    engine.mark_ready(1, y)
    engine.wait_all(20_000)
    engine.shutdown()
    return {"x": x.tolist(), "y": y.tolist()}


def test_standalone_all_gather_gives_every_rank_every_slice() -> None:
    results = distributed_test(_standalone_gather_job, world_size=3, timeout=90)
    gathered = [float(i % 3 + 10 * (i // 3)) for i in range(9)]
    for out in results.values():
        assert out["x"] + out["y"] == gathered[:7]  # the padding never reaches the tensors


def _gloo_threads() -> int:
    """Gloo's worker threads in this process. Where torch leaves them unnamed (before 2.11),
    every thread of the process: the engine's own threads then count too, and `after == before`
    checks that shutdown ended them along with the group's."""
    import glob

    from commsched.torch_compat import GLOO_WORKER_THREAD_NAME

    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path, encoding="utf-8") as handle:
                names.append(handle.read().strip())
        except OSError:
            continue  # a thread that ended meanwhile
    if GLOO_WORKER_THREAD_NAME is None:
        return len(names)
    return sum(name == GLOO_WORKER_THREAD_NAME for name in names)


def _shutdown_job() -> dict:
    """EngineHandle.shutdown() destroys the engine's own Gloo group there and then (inside
    release_transport, without the GIL), not later whenever Python frees the handle: a Gloo
    worker that needs the GIL to free a tensor would otherwise deadlock with the thread that
    destroys the group while holding it."""
    import time

    import torch

    import commsched
    from commsched.compression import Compression
    from commsched.plan import Block, Piece, Plan, TensorSpec
    from commsched.runtime.engine.handle import EngineHandle

    world = commsched.init()
    world.all_gather_object(0)  # the control group's threads exist before counting
    before = _gloo_threads()
    handle = EngineHandle(world, [TensorSpec(0, "t", 4, "float32", 4, 0)], 20.0)
    handle.install(Plan("one", (Block(0, (Piece(0, 0, 4),), "float32"),)), Compression.none,
                   1.0, 1.0)
    handle.mark_ready(0, torch.ones(4))
    handle.wait()  # one collective: the group's worker threads are running now
    during = _gloo_threads()
    handle.shutdown()
    # A joined thread can stay listed under /proc/self/task for a moment while the kernel
    # finishes its exit (seen once on a loaded 2-core machine: 4 against 2). Read again for a
    # short while: `handle` is still alive, so threads kept until Python frees it still count.
    deadline = time.monotonic() + 2.0
    while (after := _gloo_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    del handle
    return {"before": before, "during": during, "after": after}


def test_engine_shutdown_destroys_its_group_at_once() -> None:
    results = distributed_test(_shutdown_job, world_size=2, timeout=60)
    for out in results.values():
        assert out["during"] > out["before"]  # the engine's group has worker threads
        assert out["after"] == out["before"], out


def _zero_copy_job() -> dict:
    import commsched

    world = commsched.init()
    engine = _C.Engine(world.process_group, ["w", "x", "y", "h", "p"], 20_000)
    engine.install_plan([
        _block(0, AR, [(0, 0, 6)]),  # one whole contiguous float32 gradient: no copy
        _block(1, AR, [(1, 0, 3), (2, 0, 2)]),  # two tensors fused: 5 float32 copied
        _block(2, AR, [(3, 0, 4)], wire="float16"),  # a cast on the wire: 4 float16 copied
        _block(3, AR, [(4, 5, 3)]),  # partitions of one gradient (Note [A partition is
        _block(4, AR, [(4, 0, 5)]),  # reduced in place]): no copy either
    ])
    w = torch.full((2, 3), float(world.rank + 1))
    p = torch.arange(8.0).reshape(2, 4) * (world.rank + 1)
    tensors = [w, torch.ones(3), torch.ones(2), torch.ones(4), p]
    for tid, tensor in enumerate(tensors):
        engine.mark_ready(tid, tensor)
    engine.wait_all(20_000)
    packed = engine.packed_bytes
    engine.shutdown()
    return {"packed": packed, "w": w.flatten().tolist(), "p": p.flatten().tolist()}


def test_single_tensor_blocks_are_reduced_in_place() -> None:
    results = distributed_test(_zero_copy_job, world_size=2, timeout=90)
    for out in results.values():
        assert out["packed"] == 5 * 4 + 4 * 2  # the fused and the cast block only
        assert out["w"] == [3.0] * 6  # 1 + 2, reduced in the gradient's own memory
        assert out["p"] == [3.0 * i for i in range(8)]  # each partition in its own place


def _kept_buffers_job() -> dict:
    import commsched

    world = commsched.init()
    rank, size = world.rank, world.size
    engine = _C.Engine(world.process_group, ["a", "b", "c", "d"], 20_000)
    # 1.2 MB per tensor: every fused buffer is kept (Note [Host fusion buffers are kept]).
    n = 300_000
    avg = 1.0 / size
    engine.install_plan([
        _block(0, AR, [(0, 0, n), (1, 0, n)], post=avg),
        _block(1, RS, [(2, 0, n), (3, 0, n - 1)]),  # padded: the all-gather lands in a buffer
        _block(2, AG, [(2, 0, n), (3, 0, n - 1)], post=avg, released=True, source=1),
    ])
    out: dict[str, Any] = {"exact": [], "allocations": []}
    for iteration in range(4):
        grads = [torch.full((n,), float(rank + 10 * iteration + t)) for t in range(3)]
        grads.append(torch.full((n - 1,), float(rank + 10 * iteration + 3)))
        for tid in (3, 2, 1, 0):
            engine.mark_ready(tid, grads[tid])
        engine.release(2)
        engine.wait_all(20_000)
        mean = (size - 1) / 2
        out["exact"].append(all(bool((g == mean + 10 * iteration + t).all())
                                for t, g in enumerate(grads)))
        out["allocations"].append(engine.kept_buffer_allocations)
    out["kept"] = engine.kept_buffer_bytes
    engine.install_plan([_block(0, AR, [(0, 0, n)], post=avg)])
    out["kept_after_new_plan"] = engine.kept_buffer_bytes
    engine.shutdown()
    return out


def test_host_fusion_buffers_are_reused_across_iterations() -> None:
    results = distributed_test(_kept_buffers_job, world_size=2, timeout=90)
    for out in results.values():
        assert out["exact"] == [True] * 4, out
        # Each iteration takes four buffers: the fused all-reduce's, the padded reduce-scatter's
        # input and shard, the all-gather's output. The three of ~2.4 MB fit each other's
        # requests, so how many are new in an iteration depends on how its blocks overlapped.
        # The engine holds each shard for its all-gather until the next iteration's
        # reduce-scatter replaces it (Engine::shards_), so two shards may be in use at once:
        # five buffers at most (fresh clones counted [3, 4, 4, 4] and [3, 5, 5, 5]). Without
        # reuse the count would grow by at least two every iteration.
        assert out["allocations"][0] >= 2 and out["allocations"][-1] <= 5, out
        assert out["kept"] >= 2 * 300_000 * 4 * 2, out
        assert out["kept_after_new_plan"] == 0, out
