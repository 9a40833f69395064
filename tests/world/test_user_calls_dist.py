"""Horovod's calls on a script's own tensors (world/tensor_collectives.py), with process sets
and the errors they raise on every rank at once, and a model wrapped in DDP refused at wrap
time (params.refuse_data_parallel), on 3 Gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes


def _error(call: Any) -> str:
    try:
        call()
    except (ValueError, TypeError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _job() -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    import commsched

    commsched.init()
    rank = commsched.rank()
    out: dict[str, Any] = {}
    value = torch.tensor([float(rank), 2.0])
    out["average"] = commsched.allreduce(value, op=commsched.Average)
    out["sum"] = commsched.allreduce(value, op=commsched.Sum)
    out["scaled"] = commsched.allreduce(value, average=False, prescale_factor=2.0,
                                        postscale_factor=0.5)
    inplace = value.clone()
    out["in_place_is_same"] = commsched.allreduce_(inplace) is inplace
    out["in_place"] = inplace
    out["value_untouched"] = value
    out["integer_sum"] = commsched.allreduce(torch.tensor([rank], dtype=torch.int64),
                                             op=commsched.Sum)
    out["integer_mean"] = _error(lambda: commsched.allreduce(torch.tensor([rank])))
    out["both_ops"] = _error(lambda: commsched.allreduce(value, average=True, op=commsched.Sum))
    out["gathered"] = commsched.allgather(torch.full((rank, 2), float(rank)))  # rank 0: no rows
    out["scalars"] = commsched.allgather(torch.tensor(float(rank)))
    out["gather_mismatch"] = _error(lambda: commsched.allgather(torch.zeros(1, 2 + (rank == 2))))
    out["broadcast"] = commsched.broadcast(torch.tensor([rank * 10.0]), root_rank=2)
    out["bad_root"] = _error(lambda: commsched.broadcast(value, root_rank=3))
    pair = [0, 2]
    if rank in pair:
        out["set_sum"] = commsched.allreduce(value, op=commsched.Sum, process_set=pair)
        out["set_gather"] = commsched.allgather(torch.tensor([float(rank)]), process_set=pair)
        out["set_broadcast"] = commsched.broadcast(torch.tensor([float(rank)]), root_rank=2,
                                                   process_set=pair)
        out["set_bad_root"] = _error(lambda: commsched.broadcast(value, 1, process_set=pair))
    else:
        out["outside_set"] = _error(lambda: commsched.allreduce(value, process_set=pair))
    out["layout"] = (commsched.local_size(), commsched.cross_rank(), commsched.cross_size())
    # A model wrapped in DDP, or its parameters, would be reduced twice.
    net = nn.Linear(4, 2)
    ddp = DistributedDataParallel(net)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    out["ddp_model"] = _error(lambda: commsched.DistributedOptimizer(
        sgd, named_parameters=net.named_parameters(), model=ddp))
    out["ddp_params"] = _error(lambda: commsched.DistributedOptimizer(
        sgd, named_parameters=ddp.named_parameters()))
    out["inner_params"] = _error(lambda: commsched.DistributedOptimizer(
        sgd, named_parameters=net.named_parameters(), model=net))
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return distributed_test(_job, world_size=3, timeout=120)


def test_allreduce_means_and_sums_as_horovod(results: dict[int, dict[str, Any]]) -> None:
    for rank, got in results.items():
        assert torch.equal(got["average"], torch.tensor([1.0, 2.0])), (rank, got["average"])
        assert torch.equal(got["sum"], torch.tensor([3.0, 6.0]))
        assert torch.equal(got["scaled"], torch.tensor([3.0, 6.0]))  # (2 x) summed, halved
        assert got["in_place_is_same"] and torch.equal(got["in_place"], got["average"])
        assert torch.equal(got["value_untouched"], torch.tensor([float(rank), 2.0]))
        assert torch.equal(got["integer_sum"], torch.tensor([3]))
        assert "op=commsched.Sum" in got["integer_mean"] and "int64" in got["integer_mean"]
        assert got["both_ops"].startswith("ValueError") and "not both" in got["both_ops"]


def test_allgather_concatenates_uneven_rows_in_rank_order(
        results: dict[int, dict[str, Any]]) -> None:
    expected = torch.tensor([[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])
    for rank, got in results.items():
        assert torch.equal(got["gathered"], expected), (rank, got["gathered"])
        assert torch.equal(got["scalars"], torch.tensor([0.0, 1.0, 2.0]))
        # Every rank names the rank whose tensor does not fit, instead of hanging.
        assert "rank 2 gives a torch.float32 tensor of shape [1, 3]" in got["gather_mismatch"], \
            got["gather_mismatch"]


def test_broadcast_and_its_root(results: dict[int, dict[str, Any]]) -> None:
    for got in results.values():
        assert torch.equal(got["broadcast"], torch.tensor([20.0]))
        assert "root_rank 3 is not a rank of the world of 3" in got["bad_root"]


def test_calls_within_a_process_set(results: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 2):
        got = results[rank]
        assert torch.equal(got["set_sum"], torch.tensor([2.0, 4.0])), got["set_sum"]
        assert torch.equal(got["set_gather"], torch.tensor([0.0, 2.0]))
        assert torch.equal(got["set_broadcast"], torch.tensor([2.0]))
        assert "root_rank 1 is not in the process set" in got["set_bad_root"]
    assert "rank 1 is not in the process set [0, 2]" in results[1]["outside_set"]


def test_host_layout_of_one_host(results: dict[int, dict[str, Any]]) -> None:
    assert all(got["layout"] == (3, 0, 1) for got in results.values())


def test_a_model_wrapped_in_ddp_is_refused(results: dict[int, dict[str, Any]]) -> None:
    for got in results.values():
        for case in ("ddp_model", "ddp_params", "inner_params"):
            assert got[case].startswith("ValueError") and "DistributedDataParallel" in got[case]
            assert "reduce them a second time" in got[case] and "ddp_model.module" in got[case]
        assert "model= is (or holds" in got["ddp_model"]
        assert "parameters given to DistributedOptimizer belong" in got["ddp_params"]
