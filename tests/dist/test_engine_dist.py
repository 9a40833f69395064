"""The C++ engine on real Gloo ranks: partitions, dtypes, plan order, timeouts."""

from __future__ import annotations

import torch
from helpers import distributed_test


def _partition_job() -> dict:
    import commsched
    from commsched import _C

    world = commsched.init()
    rank = world.rank
    engine = _C.Engine(world.process_group, ["a", "b", "c"], 20_000)
    half = 1.0 / world.size
    engine.install_plan([
        (0, _C.ALLREDUCE, "float32", 1.0, half, [(0, 2, 3), (1, 0, 4)]),
        (1, _C.ALLREDUCE, "float32", 1.0, half, [(0, 0, 2)]),
        (2, _C.ALLREDUCE, "float16", 2.0, half / 2.0, [(2, 0, 3)]),  # fp64 on an fp16 wire
    ])
    out = {}
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
    engine.install_plan([(0, _C.ALLREDUCE, "float32", 1.0, 1.0, [(0, 0, 4)]),
                         (1, _C.ALLREDUCE, "float32", 1.0, 1.0, [(1, 0, 4)])])
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
