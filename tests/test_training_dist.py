"""Training through DistributedOptimizer on Gloo ranks (torch.distributed bootstrap) equals a
single-process reference that averages every rank's gradient itself."""

from __future__ import annotations

import itertools
import json
import os

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

STEPS = 4


class TwoHeads(nn.Module):
    """Rank r uses head r % 2 only: the other head has no gradient on that rank."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 3)])
        self.wide = nn.Linear(3, 3).to(torch.float64)

    def forward(self, x: torch.Tensor, head: int) -> torch.Tensor:
        out = self.heads[head](torch.relu(self.body(x)))
        return out + self.wide(out.double()).float()


def _data(step: int, rank: int) -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(100 * step + rank))


def _grads(model: nn.Module, step: int, rank: int) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=False)
    model(_data(step, rank), rank % 2).square().mean().backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


def _reference(world: int, variant: str) -> list[torch.Tensor]:
    torch.manual_seed(3)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    for step in range(STEPS):
        per_rank = [_grads(model, step, r) for r in range(world)]
        for i, p in enumerate(model.parameters()):
            total = sum((g[i] for g in per_rank), torch.zeros_like(p))
            p.grad = total if variant == "sum" else total / world
        opt.step()
    return [p.detach() for p in model.parameters()]


def _train(policy: str, variant: str) -> list[torch.Tensor]:
    import commsched

    rank = commsched.rank()
    torch.manual_seed(3)
    model = TwoHeads()
    kwargs: dict = {"policy": policy, "profile_steps": 1}
    if variant == "sum":
        kwargs["op"] = commsched.Sum
    if variant == "predivide":
        kwargs["gradient_predivide_factor"] = 2.0
    if variant == "groups":
        kwargs["groups"] = [[model.body.weight, model.heads[1].bias], [model.wide.weight]]
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                         named_parameters=model.named_parameters(), **kwargs)
    for step in range(STEPS):
        opt.zero_grad()
        model(_data(step, rank), rank % 2).square().mean().backward()
        opt.step()
    opt.session.close()
    return [p.detach() for p in model.parameters()]


VARIANTS = ["average", "sum", "predivide", "groups"]
POLICIES = ["horovod", "ddp", "mgwfbp"]


def _training_job(timeline_dir: str) -> dict:
    import commsched

    commsched.init()
    world = commsched.size()
    out = {}
    for policy, variant in itertools.product(POLICIES, VARIANTS):
        ours = _train(policy, variant)
        expected = _reference(world, variant)
        out[f"{policy}-{variant}"] = max(float((a - b).abs().max()) for a, b in
                                         zip(ours, expected, strict=True))
    os.environ["COMMSCHED_TIMELINE"] = os.path.join(timeline_dir, "trace.json")
    _train("mgwfbp", "average")
    del os.environ["COMMSCHED_TIMELINE"]
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_training_matches_single_process_reference(world_size: int, tmp_path) -> None:
    results = distributed_test(_training_job, world_size=world_size, timeout=240,
                               args=(str(tmp_path),))
    for rank, diffs in results.items():
        for key, diff in diffs.items():
            assert diff < 1e-5, f"rank {rank}: {key} differs from the reference by {diff}"
    gradient_bytes = sum(p.numel() * p.element_size() for p in TwoHeads().parameters())
    for rank in range(world_size):
        with open(tmp_path / f"trace.rank{rank}.json", encoding="utf-8") as handle:
            events = json.load(handle)
        names = [e["name"] for e in events]
        # Every gradient is marked ready once per step (one this rank did not compute too, as
        # zeros), and each step ends with one mark.
        assert names.count("ready:body.weight") == names.count("ready:heads.1.bias") == STEPS
        assert [n for n in names if n.startswith("iteration ")] == \
            [f"iteration {i}" for i in range(1, STEPS + 1)]
        plans = [n.split()[1] for n in names if n.startswith("plan ")]
        assert plans == ["layerwise", "mgwfbp"]  # profiling for one step, then the policy's
        spans = [e for e in events if e["ph"] == "X"]
        assert {"pack", "allreduce", "unpack"} <= {e["name"] for e in spans}
        for span in spans:
            assert span["dur"] >= 0 and span["ts"] >= 0, span  # after the writer's origin
            if span["tid"] in (1, 2):  # the engine's spans: about one block each
                assert {"block", "bytes", "op"} <= set(span["args"])
                assert span["args"]["bytes"] > 0 and span["args"]["op"] == "allreduce", span
            else:  # the training thread: waits on the engine, optimizer updates
                assert span["tid"] == 3 and span["name"] in ("wait", "update")
        thread = [e["name"] for e in spans if e["tid"] == 3]
        assert thread.count("wait") == thread.count("update") == STEPS  # synchronous plans
        # Lane 2, per block: the collective, then its unpack from the moment it completed.
        completion = [e for e in spans if e["tid"] == 2]
        collectives, unpacks = completion[0::2], completion[1::2]
        assert len(collectives) == len(unpacks)
        for collective, unpack in zip(collectives, unpacks, strict=True):
            assert (collective["name"], unpack["name"]) == ("allreduce", "unpack")
            assert unpack["args"]["block"] == collective["args"]["block"]
            assert unpack["ts"] == collective["ts"] + collective["dur"]
        # Every step reduces every gradient exactly once (no compression: its own bytes).
        assert sum(c["args"]["bytes"] for c in collectives) == STEPS * gradient_bytes
