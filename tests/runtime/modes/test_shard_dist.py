"""shard_optimizer=True on 2 and 3 Gloo ranks (issue 57, items 1, 2 and 4).

One job per world size trains, under each synchronous policy and dear with SGD (momentum and
weight decay), Adam and AdamW (two param groups), and under horovod with torch's other
element-wise optimizers, always with a StepLR scheduler, the same model from the same data
twice: sharded and unsharded. The parameters must agree within float
tolerance, each rank's optimizer state must be about 1/N of the whole, and state_dict() must
gather the whole state: the unsharded run's, which a plain optimizer loads and which a sharded
run re-shards and continues from as the unsharded run continues from its own, and bit for bit
as the sharded run that never stopped.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

POLICIES = ("horovod", "ddp", "mgwfbp", "dear")
# On 2 ranks each policy with the three optimizers users run most, and torch's other
# element-wise ones once; on 3 ranks (2 cores: slower) each policy with SGD and AdamW.
CASES = {2: [(policy, name) for policy in POLICIES for name in ("sgd", "adam", "adamw")]
         + [("horovod", name) for name in ("rmsprop", "adagrad", "nadam", "radam", "asgd")],
         3: [(policy, name) for policy in POLICIES for name in ("sgd", "adamw")]}
OTHERS = {"rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad,
          "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam, "asgd": torch.optim.ASGD}
STEPS = 7
PROFILE_STEPS = 2


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(9, 31), nn.Tanh(), nn.Linear(31, 17), nn.Tanh(),
                         nn.Linear(17, 3))


def _optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if name in OTHERS:
        return OTHERS[name](params, lr=0.01)
    # Two groups: the biases without weight decay, as users configure AdamW.
    weights = [p for p in params if p.dim() > 1]
    biases = [p for p in params if p.dim() == 1]
    return torch.optim.AdamW([{"params": weights, "weight_decay": 0.1},
                              {"params": biases, "weight_decay": 0.0, "lr": 0.02}], lr=0.01)


def _loss(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(5, 9, generator=gen), torch.randn(5, 3, generator=gen)
    return nn.functional.mse_loss(model(x), y)


def _train(policy: str, name: str, shard: bool, rank: int, steps: range = range(STEPS),
           resume: dict[str, Any] | None = None, snapshot_at: int | None = None
           ) -> dict[str, Any]:
    import commsched
    from commsched.runtime.modes.shard_state import state_bytes

    model = _model()
    inner = _optimizer(name, model)
    opt = commsched.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                         model=model, policy=policy,
                                         profile_steps=PROFILE_STEPS, shard_optimizer=shard)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["state_dict"])
        schedule.load_state_dict(resume["schedule"])
    snapshot = None
    for step in steps:
        if step == snapshot_at:
            snapshot = copy.deepcopy({"state_dict": opt.state_dict(), "model": model.state_dict(),
                                      "schedule": schedule.state_dict()})
        opt.zero_grad()
        _loss(model, step, rank).backward()
        opt.step()
        schedule.step()
    opt.flush()  # dear's last all-gathers (state_dict() flushes too)
    out = {"snapshot": snapshot, "params": [p.detach().clone() for p in model.parameters()],
           "state_bytes": state_bytes(opt), "state_dict": opt.state_dict(),
           "model": {k: v.clone() for k, v in model.state_dict().items()},
           "schedule": schedule.state_dict()}
    opt.session.close()
    return out


def _sparse_refusal() -> str:
    """What wrapping a sparse embedding with shard_optimizer says (the check needs a world)."""
    import commsched

    embedding = nn.Embedding(10, 3, sparse=True)
    try:
        commsched.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.1),
                                       named_parameters=embedding.named_parameters(),
                                       model=embedding, shard_optimizer=True)
    except ValueError as err:
        return str(err)
    return "wrapped"


def _accumulated(policy: str, shard: bool, rank: int) -> list[torch.Tensor]:
    """Two micro-batches per step, the first inside no_sync()."""
    import commsched

    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model=model,
        named_parameters=model.named_parameters(), policy=policy, profile_steps=PROFILE_STEPS,
        shard_optimizer=shard)
    for step in range(STEPS):
        opt.zero_grad()
        with opt.no_sync():
            _loss(model, 2 * step, rank).backward()
        _loss(model, 2 * step + 1, rank).backward()
        opt.step()
    opt.flush()
    params = [p.detach().clone() for p in model.parameters()]
    opt.session.close()
    return params


AUTO_STEPS = 30  # past auto's profiling, its choice's check window and its trials


def _auto(rank: int) -> dict[str, Any]:
    """auto under sharding against unsharded horovod: every plan it tries runs sharded, and
    each is synchronous training's arithmetic (dear's update, deferred, is the same update)."""
    from benchmarks.harness.measured_vs_predicted import predict

    plain = _train("horovod", "adam", False, rank, range(AUTO_STEPS))["params"]
    import commsched

    model = _model()
    opt = commsched.DistributedOptimizer(_optimizer("adam", model),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy="auto", profile_steps=PROFILE_STEPS,
                                         shard_optimizer=True)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)  # as _train's
    installed = set()
    for step in range(AUTO_STEPS):
        opt.zero_grad()
        _loss(model, step, rank).backward()
        opt.step()
        schedule.step()
        installed.add(opt.plan.policy)
    opt.flush()
    assert opt.auto is not None and opt.auto.chosen is not None
    policy = opt.auto.chosen.policy
    document = opt.session.profile_document()
    out = {"param_diff": _max_diff(plain, list(model.parameters())), "policy": policy.value,
           "ranked": sorted({c.policy.value for c in opt.auto.choices}),
           "installed": sorted(installed),
           "update_shards": document.get("update_shards"),
           "predicted_s": predict(document, opt.plan, policy).iteration_s}
    opt.session.close()
    return out


def _job(cases: list[tuple[str, str]]) -> dict[str, Any]:
    rank = int(os.environ["RANK"])
    results: dict[str, Any] = {"sparse": _sparse_refusal(), "no_sync": {
        policy: _max_diff(_accumulated(policy, False, rank), _accumulated(policy, True, rank))
        for policy in ("horovod", "dear")}}
    if len(cases) > 10:  # the 2-rank job
        results["auto"] = _auto(rank)
    for policy, name in cases:
        plain = _train(policy, name, False, rank)
        sharded = _train(policy, name, True, rank)
        # Compared before the resumed runs, which step the loaded tensors in place.
        state_diff = _state_diff(plain["state_dict"], sharded["state_dict"])
        plain_loads = _plain_loads(name, sharded["state_dict"])
        # Resumed from the sharded run's whole state, 3 more steps, against the plain run
        # resumed from its own.
        more = range(STEPS, STEPS + 3)
        more_plain = _train(policy, name, False, rank, more, plain)
        more_sharded = _train(policy, name, True, rank, more, sharded)
        # The same plan on both sides (a new run may profile its way to another, and on 3
        # ranks another plan sums in another order): the run that never stopped saved the
        # checkpoint the resumed one starts from.
        straight = _train(policy, name, True, rank, range(STEPS + 3), snapshot_at=STEPS)
        resumed = _train(policy, name, True, rank, more, straight["snapshot"])
        results[f"{policy}/{name}"] = {
            "param_diff": _max_diff(plain["params"], sharded["params"]),
            "moved": _max_diff(plain["params"], list(_model().parameters())),
            "resumed_diff": _max_diff(more_plain["params"], more_sharded["params"]),
            "resume_exact": all(torch.equal(a, b) for a, b in
                                zip(straight["params"], resumed["params"], strict=True)),
            "bytes": (plain["state_bytes"], sharded["state_bytes"]),
            "state_diff": state_diff, "plain_loads": plain_loads,
        }
    return results


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(a, b, strict=True))


def _state_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a["state"].keys() == b["state"].keys(), (a["state"].keys(), b["state"].keys())
    worst = 0.0
    for index, entry in a["state"].items():
        assert entry.keys() == b["state"][index].keys()
        for key, value in entry.items():
            other = b["state"][index][key]
            if isinstance(value, torch.Tensor):
                assert value.shape == other.shape, (index, key)
                worst = max(worst, float((value.float() - other.float()).abs().max()))
    assert a["param_groups"] == b["param_groups"]
    return worst


def _plain_loads(name: str, state: dict[str, Any]) -> bool:
    plain = _optimizer(name, _model())
    plain.load_state_dict({k: v for k, v in state.items() if k != "commsched"})
    return len(plain.state) == len(state["state"])


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_training_matches_unsharded(world: int) -> None:
    results = distributed_test(_job, world_size=world, timeout=240.0, args=(CASES[world],))
    for rank, by_case in results.items():
        sparse = by_case.pop("sparse")
        assert "sparse gradients ('weight')" in sparse and "sparse_as_dense" in sparse, sparse
        for policy, diff in by_case.pop("no_sync").items():
            assert diff < 1e-5, (rank, policy, "no_sync()", diff)
        auto = by_case.pop("auto", None)
        if world == 2:
            assert auto is not None
            assert auto["param_diff"] < 1e-5, (rank, auto)
            assert set(auto["ranked"]) <= set(POLICIES) and auto["policy"] in POLICIES, auto
            assert len(auto["installed"]) > 1, auto  # a profiling plan, then its choices
            # Its profile says the updates were of slices, and the simulator reads it.
            assert auto["update_shards"] == world, auto
            assert auto["predicted_s"] > 0, auto
        for case, r in by_case.items():
            assert r["moved"] > 1e-3, (case, "the run did not train")
            assert r["param_diff"] < 1e-5, (rank, case, r["param_diff"])
            assert r["resumed_diff"] < 1e-5, (rank, case, r["resumed_diff"])
            assert r["state_diff"] < 1e-5, (rank, case, r["state_diff"])
            assert r["resume_exact"], (rank, case, "the resumed run left the uninterrupted one")
            assert r["plain_loads"], (rank, case)
            whole, mine = r["bytes"]
            # The slices of one rank: 1/N of the whole plus the padding of each block.
            assert mine <= whole / world * 1.05 + 64, (rank, case, whole, mine)
            assert mine > 0, (rank, case)


def _state_dict_on_rank_0_only() -> str:
    """Rank 0 asks for the state alone; rank 1 waits past the timeout without asking."""
    import time

    import commsched

    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         profile_steps=1, shard_optimizer=True)
    rank = int(os.environ["RANK"])
    for step in range(3):
        opt.zero_grad()
        _loss(model, step, rank).backward()
        opt.step()
    if rank == 1:
        time.sleep(7)
        return "waited"
    try:
        opt.state_dict()
    except commsched.RankFailureError as err:
        return str(err)
    return "no error"


def test_state_dict_on_one_rank_names_the_cause() -> None:
    results = distributed_test(_state_dict_on_rank_0_only, world_size=2, timeout=60.0,
                               env={"COMMSCHED_TIMEOUT": "3"})
    assert results[1] == "waited"
    assert "call state_dict() on every rank" in results[0], results[0]
