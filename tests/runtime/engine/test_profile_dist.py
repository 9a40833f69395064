"""COMMSCHED_PROFILE: the profile JSON after the profiling steps, and identical plans."""

from __future__ import annotations

import json
import pathlib

import pytest
from helpers import distributed_test

from commsched.runtime.engine.collective_fit import fit_collective

pytestmark = pytest.mark.processes


def _profile_job(path: str, lag_s: float = 0.0) -> dict:
    import time

    import torch
    from torch import nn

    import commsched

    rank = commsched.init().rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="prophet", profile_steps=3, profile=path,
                                         partition_bytes=512)
    iteration_s = []  # wall time of each step on this rank: the profile's times fall within
    for step in range(5):
        started = time.perf_counter()
        opt.zero_grad()
        if rank == 1:
            time.sleep(lag_s)  # a rank behind the others: they wait for it in every collective
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
        model(x).square().mean().backward()
        opt.step()
        iteration_s.append(time.perf_counter() - started)
    opt.flush()
    return {"fingerprint": opt.plan.fingerprint, "policy": opt.plan.policy,
            "iteration_s": iteration_s}


def test_profile_json_and_identical_plans(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "profile.json"
    results = distributed_test(_profile_job, world_size=2, timeout=90, args=(str(path),))
    plans = [(r["policy"], r["fingerprint"]) for r in results.values()]
    assert plans[0] == plans[1] and plans[0][0] == "prophet"
    profiled_s = results[0]["iteration_s"][:3]  # rank 0 writes its own profile
    doc = json.loads(path.read_text())
    # Written once, when the 3 profiling steps ended and the prophet plan was built.
    assert doc["schema_version"] == 2 and doc["world_size"] == 2 and doc["iterations"] == 3
    assert doc["compute"]["before_first_ready_s"] > 0 and doc["compute"]["step_s"] > 0
    assert {t["name"]: t["module"] for t in doc["tensors"]}["2.bias"] == "2"
    names = [t["name"] for t in doc["tensors"]]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert [t["bytes"] for t in doc["tensors"]] == [4 * n for n in (16 * 32, 32, 32 * 32, 32,
                                                                    32 * 4, 4)]
    ready = {t["name"]: t["ready_time_s"] for t in doc["tensors"]}
    # Seconds from the iteration's first ready gradient: backward produces the last layer
    # first (its bias before its weight, which waits for a transpose), then towards the input.
    in_backward_order = ["4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"]
    times = [ready[name] for name in in_backward_order]
    assert times[0] == 0.0 and times == sorted(times), ready
    # Seconds (not ms or us): the spread of one backward pass, within a step's wall time.
    assert 0 < times[-1] < max(profiled_s), (ready, profiled_s)
    modules = sorted(doc["modules"], key=lambda m: m["forward_order"])
    assert [m["name"] for m in modules] == ["", "0", "1", "2", "3", "4"]
    assert all(m["forward_time_s"] > 0 for m in modules)
    root, layers = modules[0], modules[1:]
    for layer in layers:  # no children: a layer's own time is all of its forward time
        assert layer["self_time_s"] == layer["forward_time_s"], layer
    children = sum(layer["forward_time_s"] for layer in layers)
    assert root["self_time_s"] == pytest.approx(max(root["forward_time_s"] - children, 0.0))
    assert root["self_time_s"] < root["forward_time_s"]  # the layers ran inside it
    allreduce = doc["collectives"]["allreduce"]
    samples = allreduce["samples"]
    # The profiling plan: one collective per tensor, each at its median over the latest 2 of
    # the 3 iterations (the fit's window: the latest half, as for ready times; Note [A
    # collective's cost is its typical iteration's]).
    assert sorted(n for n, _ in samples) == sorted(t["bytes"] for t in doc["tensors"])
    assert all(seconds > 0 for _, seconds in samples), samples
    # The channel's busy time of a typical profiled step, within the slower of the last 2.
    assert sum(t for _, t in samples) < max(profiled_s[1:]), (samples, profiled_s)
    alpha, beta = allreduce["alpha_s"], allreduce["beta_s_per_byte"]
    fitted = fit_collective([(n, t) for n, t in samples])
    assert (alpha, beta) == (fitted.alpha, fitted.beta)  # the fit of the samples written
    # Note [Fitting a collective's cost]: the line gives the samples' total time back.
    total_s = sum(t for _, t in samples)
    assert sum(alpha + beta * n for n, _ in samples) == pytest.approx(total_s)


def test_plans_follow_the_rank_the_others_wait_for(tmp_path: pathlib.Path) -> None:
    # Note [The rank the others wait for]: rank 1 spends 150 ms more before each forward pass,
    # so rank 0's first block of every iteration holds that wait. The plan, and the profile
    # rank 0 writes, are rank 1's: its compute before the first gradient holds the 150 ms.
    path = tmp_path / "profile.json"
    lag_s = 0.15
    results = distributed_test(_profile_job, world_size=2, timeout=90, args=(str(path), lag_s))
    assert results[0]["fingerprint"] == results[1]["fingerprint"]
    doc = json.loads(path.read_text())
    assert doc["compute"]["before_first_ready_s"] >= lag_s
    assert sum(t for _, t in doc["collectives"]["allreduce"]["samples"]) < lag_s



def _alternating_lag_job(path: str, lag_s: float) -> dict:
    import time

    import torch
    from torch import nn

    import commsched

    rank = commsched.init().rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         policy="horovod", profile_steps=6, profile=path)
    for step in range(6):
        opt.zero_grad()
        if step == 3 + rank:  # each rank is the late one in one of the last three iterations
            time.sleep(lag_s)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
        model(x).square().mean().backward()
        opt.step()
    opt.flush()
    return {"own_before_first_ready_s":
            opt.session.engine.profiler.compute()["before_first_ready_s"]}


def test_gradients_are_ready_when_the_last_rank_has_them(tmp_path: pathlib.Path) -> None:
    # Note [Every rank's gradients]: of the three iterations the profile is made from (the
    # latest half of six), rank 0 is late in one and rank 1 in another, so each rank's own
    # median holds no lag while every collective waited for one in two of the three.
    path = tmp_path / "profile.json"
    lag_s = 0.2
    results = distributed_test(_alternating_lag_job, world_size=2, timeout=90,
                               args=(str(path), lag_s))
    assert all(r["own_before_first_ready_s"] < lag_s for r in results.values()), results
    doc = json.loads(path.read_text())
    assert doc["compute"]["before_first_ready_s"] >= lag_s
