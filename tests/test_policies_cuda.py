"""Every policy on CUDA tensors: in a world of one against the plain optimizer, through an NCCL
group of one (the process-group transport and NCCL's streams), and on 2 ranks with Gloo on CUDA
tensors against a per-rank summed reference. Equal bit for bit in every case: reducing over one
rank is the identity, and a sum of two floats does not depend on where it is computed."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import torch
from cuda_models import (
    RANK_ENV,
    RANK_TIMEOUT_S,
    bit_equal,
    max_difference,
    train_plain,
    train_wrapped,
)
from helpers import distributed_test

from commsched.config import Policy

pytestmark = [pytest.mark.gpu, pytest.mark.processes]

POLICIES = [p.value for p in Policy]


@pytest.mark.parametrize("policy", POLICIES)
def test_world_of_one_equals_the_plain_optimizer(policy: str) -> None:
    import commsched

    commsched.init()
    assert commsched.size() == 1
    ours, opt = train_wrapped(policy, rank=0)
    reference = train_plain()
    assert bit_equal(ours, reference), f"{policy}: differs by {max_difference(ours, reference)}"
    assert all(p.is_cuda for p in ours.parameters())
    # A local engine has no collectives to time, but its ready times come from device events.
    clocks = opt.session.profile_document()["clocks"]
    assert clocks["ready_time_s"] == "device_event", clocks
    opt.session.close()


def _nccl_group_of_one(timeline_dir: str) -> dict:
    import torch.distributed as dist

    import commsched
    from commsched.runtime.engine.handle import EngineHandle

    torch.cuda.set_device(0)
    EngineHandle.process_group_at_size_one = True  # test-only: NCCL group of one
    commsched.init()
    assert dist.get_backend() == "nccl" and commsched.size() == 1
    out: dict = {}
    for policy in POLICIES:
        print(f"training with {policy}", file=sys.stderr, flush=True)  # a hang's where
        if policy == "horovod":
            os.environ["COMMSCHED_TIMELINE"] = os.path.join(timeline_dir, "trace.json")
        ours, opt = train_wrapped(policy, rank=0)
        os.environ.pop("COMMSCHED_TIMELINE", None)
        engine = opt.session.engine
        assert engine._group is not None, "the process-group transport was not used"
        assert engine._engine.last_clocks() == {"ready": "device_event",
                                                "collective": "device_event"}
        doc = opt.session.profile_document()
        out[policy] = {"equal": bit_equal(ours, train_plain()),
                       "diff": max_difference(ours, train_plain()),
                       "clocks": doc["clocks"],
                       # dear's collectives are reduce-scatter and all-gather, not allreduce
                       "samples": [sample for collective in doc["collectives"].values()
                                   for sample in collective.get("samples", [])]}
        opt.session.close()
    return out


def test_nccl_group_of_one_equals_the_plain_optimizer(tmp_path: pathlib.Path) -> None:
    results = distributed_test(_nccl_group_of_one, world_size=1, timeout=RANK_TIMEOUT_S,
                               env=RANK_ENV, args=(str(tmp_path),))[0]
    for policy, result in results.items():
        assert result["equal"], f"{policy}: differs by {result['diff']}"
        assert result["clocks"]["ready_time_s"] == "device_event"
        assert result["clocks"]["collective_s"] == "device_event"
        assert result["samples"] and all(t >= 0 for _, t in result["samples"]), result
        # Optimizer calls timed for the update groups are timed on the device too.
        assert result["clocks"].get("update_s", "device_event") == "device_event", result
    # The timeline's engine spans are the device's (events on the comm stream), in order.
    events = json.loads((tmp_path / "trace.rank0.json").read_text())
    engine_spans = [e for e in events if e["ph"] == "X" and e["tid"] in (1, 2)]
    assert {"pack", "allreduce", "unpack"} <= {e["name"] for e in engine_spans}
    for span in engine_spans:
        assert span["args"]["clock"] == "device_event" and span["dur"] >= 0, span
    ready = [e for e in events if e["name"].startswith("ready:")]
    assert ready and all(e["args"]["clock"] == "cpu" for e in ready)  # when the hook ran


def _two_ranks_gloo() -> dict:
    import torch.distributed as dist

    import commsched

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="env://")  # NCCL refuses two ranks on one GPU
    rank = commsched.init().rank
    out: dict = {}
    for policy in POLICIES:
        print(f"rank {rank}: training with {policy}", file=sys.stderr, flush=True)  # a hang's where
        ours, opt = train_wrapped(policy, rank, op=commsched.Sum)
        reference = train_plain(world=2)
        out[policy] = {"equal": bit_equal(ours, reference),
                       "diff": max_difference(ours, reference),
                       "clocks": opt.session.profile_document()["clocks"]}
        opt.session.close()
    return out


def test_two_gloo_ranks_on_cuda_tensors_equal_the_summed_reference() -> None:
    results = distributed_test(_two_ranks_gloo, world_size=2, timeout=RANK_TIMEOUT_S,
                               env=RANK_ENV)
    for rank, per_policy in results.items():
        for policy, result in per_policy.items():
            assert result["equal"], f"rank {rank}, {policy}: differs by {result['diff']}"
            assert result["clocks"]["collective_s"] == "device_event", result
