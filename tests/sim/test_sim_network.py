"""Collective cost formulas of the simulator's network models, checked against hand arithmetic."""

from __future__ import annotations

import pytest

from commsched.plan import Collective, NetModel
from commsched.sim import Algorithm, BulkRateNetwork, FittedNetwork, LinkNetwork
from commsched.sim.network import bulk_seconds_per_wire_byte

AR, RS, AG = Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
ALPHA, BANDWIDTH = 1e-3, 1e6  # 1 ms per message, 1 MB/s: beta = 1 us per byte


def link(p: int, algorithm: Algorithm, compression: float = 1.0) -> LinkNetwork:
    return LinkNetwork(p, BANDWIDTH, ALPHA, algorithm, compression)


def test_ring() -> None:
    net = link(4, Algorithm.RING)
    # 2(p-1)a + 2(p-1)/p n b = 6 ms + 2 * 3/4 * 4000 us = 6 ms + 6 ms
    assert net.time(AR, 4000) == pytest.approx(0.012)
    # (p-1)a + (p-1)/p n b = 3 ms + 3 ms
    assert net.time(RS, 4000) == pytest.approx(0.006)
    assert net.time(AG, 4000) == pytest.approx(0.006)


def test_tree_rounds_up_log2() -> None:
    # 2 * ceil(log2 p) * (a + n b): p=4 -> 2 * 2 * (1 ms + 4 ms)
    assert link(4, Algorithm.TREE).time(AR, 4000) == pytest.approx(0.020)
    assert link(5, Algorithm.TREE).time(AR, 4000) == pytest.approx(0.030)  # ceil(log2 5) = 3
    # reduce-scatter is the reduce half, all-gather the broadcast half
    assert link(4, Algorithm.TREE).time(RS, 4000) == pytest.approx(0.010)
    assert link(4, Algorithm.TREE).time(AG, 4000) == pytest.approx(0.010)


def test_recursive_halving_doubling() -> None:
    net = link(8, Algorithm.RHD)
    # 2 log2(p) a + 2 (p-1)/p n b = 6 ms + 2 * 7/8 * 8 ms
    assert net.time(AR, 8000) == pytest.approx(0.006 + 0.014)
    assert net.time(RS, 8000) == pytest.approx(0.003 + 0.007)
    assert net.time(AG, 8000) == pytest.approx(0.003 + 0.007)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_one_worker_costs_nothing(algorithm: Algorithm) -> None:
    net = link(1, algorithm)
    for op in (AR, RS, AG):
        assert net.time(op, 10**9) == 0.0
        assert net.wire_bytes(op, 10**9) == 0.0
    assert net.allreduce_model() == NetModel(0.0, 0.0)


def test_compression_divides_bytes_not_latency() -> None:
    net = link(4, Algorithm.RING, compression=2.0)
    assert net.time(AR, 4000) == pytest.approx(0.006 + 0.003)
    assert net.wire_bytes(AR, 4000) == pytest.approx(3000)  # 2 * 3/4 * 2000


def test_wire_bytes_per_rank() -> None:
    for algorithm in Algorithm:
        net = link(4, algorithm)
        assert net.wire_bytes(AR, 4000) == pytest.approx(6000)
        assert net.wire_bytes(RS, 4000) == pytest.approx(3000)
        assert net.wire_bytes(AG, 4000) == pytest.approx(3000)


def test_allreduce_model_for_planners() -> None:
    model = link(4, Algorithm.RING).allreduce_model()
    assert model.alpha == pytest.approx(0.006)
    assert model.beta == pytest.approx(1.5e-6)
    assert model.time(4000) == pytest.approx(0.012)


def test_link_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="compression"):
        LinkNetwork(4, BANDWIDTH, ALPHA, compression=0.5)
    with pytest.raises(ValueError, match="workers"):
        LinkNetwork(0, BANDWIDTH, ALPHA)
    with pytest.raises(ValueError, match="bandwidth"):
        LinkNetwork(2, 0.0, ALPHA)


def test_fitted_network() -> None:
    net = FittedNetwork({AR: NetModel(1e-3, 1e-6)}, world_size=4)
    assert net.time(AR, 1000) == pytest.approx(2e-3)
    # not fitted: the all-reduce's start-up, half its per-byte cost
    assert net.time(RS, 1000) == pytest.approx(1e-3 + 0.5e-3)
    assert net.time(AG, 1000) == pytest.approx(1e-3 + 0.5e-3)
    assert net.wire_bytes(AR, 4000) == pytest.approx(6000)
    # a fitted reduce-scatter was timed against its output shard: bytes / world_size
    fitted = FittedNetwork({AR: NetModel(1e-3, 1e-6), RS: NetModel(1e-4, 2e-6)}, world_size=4)
    assert fitted.time(RS, 4000) == pytest.approx(1e-4 + 2e-6 * 1000)
    assert fitted.allreduce_model() == NetModel(1e-3, 1e-6)


def test_fitted_network_from_document() -> None:
    doc = {"schema_version": 2, "world_size": 2,
           "tensors": [{"id": 0, "name": "w", "numel": 4, "dtype": "float32",
                        "forward_index": 0, "ready_time_s": 0.0}],
           "collectives": {"allreduce": {"alpha_s": 2e-4, "beta_s_per_byte": 3e-9,
                                         "samples": [[16, 2e-4]]},
                           "all_gather": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}}}
    net = FittedNetwork.from_document(doc)
    assert net.world_size == 2 and not net.notes
    assert net.time(AR, 1000) == pytest.approx(2e-4 + 3e-6)
    assert net.time(AG, 1000) == pytest.approx(1e-4 + 1e-6)
    del doc["collectives"]
    default = FittedNetwork.from_document(doc)
    assert default.allreduce_model() == NetModel()  # the profiler's default: 100 us, 1 ns/B
    assert "default" in default.notes[0]


def test_bulk_rate_network_slows_every_collective_by_one_factor() -> None:
    fitted = FittedNetwork({AR: NetModel(1e-3, 1e-6), RS: NetModel(5e-3, 2e-6)}, world_size=3)
    # one all-reduce of 3000 bytes (4000 wire bytes per rank on 3 ranks) measured 8 ms
    assert bulk_seconds_per_wire_byte(fitted, 3000, 8e-3) == pytest.approx(2e-6)
    slowed = BulkRateNetwork(fitted, 1.5)
    assert slowed.time(AR, 3000) == pytest.approx(1.5 * 4e-3)
    assert slowed.time(RS, 3000) == pytest.approx(1.5 * 7e-3)  # shard of 1000 B: 5 + 2 ms
    assert slowed.wire_bytes(RS, 3000) == fitted.wire_bytes(RS, 3000)
    assert slowed.allreduce_model() == NetModel(1.5e-3, 1.5e-6)
    with pytest.raises(ValueError, match="bulk rate"):
        bulk_seconds_per_wire_byte(fitted, 3000, 0.0)
