"""The replayed profile (commsched/bench/profile_model.py): a FLOP profile's times follow each
module's FLOPs, the replay's gradients come when and as the profile says, and its optimizer
sleeps the update's share."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from commsched.bench import models
from commsched.bench.profile_model import (
    ComputeProfile,
    GpuRate,
    ModuleCost,
    ProfileModel,
    ProfileSpec,
    ReplayedModule,
    flop_profile,
    merged,
    replay_batch,
    replay_loss,
    sleeping_optimizer,
)

RATE = GpuRate("test", 1e9, 1e9, "a round rate for the test")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.b = nn.Linear(16, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x))) @ torch.ones(4, 4)  # the root's own matmul


def test_flop_profile_times_each_module_by_its_flops_and_keeps_the_total() -> None:
    with torch.device("meta"):
        model = _Net()
        x = torch.empty(32, 8)
    profile = flop_profile(model, [x], "net", 32, RATE)
    assert [m.name for m in profile.modules] == ["a", "b"]
    assert profile.modules[0].params == [("a.weight", [16, 8]), ("a.bias", [16])]
    # a: 2*32*8*16 FLOPs; b: 2*32*16*4, with the root's 2*32*4*4 after it added to the last.
    assert profile.modules[0].forward_s == pytest.approx(2 * 32 * 8 * 16 / 1e9)
    assert profile.modules[1].forward_s == pytest.approx((2 * 32 * 16 * 4 + 2 * 32 * 4 * 4) / 1e9)
    assert profile.backward_s == pytest.approx(2 * profile.forward_s)
    assert profile.update_s == pytest.approx(5 * 4 * (16 * 8 + 16 + 16 * 4) / 1e9)
    again = ComputeProfile.from_json(json.loads(json.dumps(profile.to_json())))
    assert again == profile


def test_a_tied_weight_belongs_to_its_first_user() -> None:
    with torch.device("meta"):
        embed = nn.Embedding(10, 4)
        head = nn.Linear(4, 10, bias=False)
        head.weight = embed.weight
        model = nn.Sequential(embed, head)
        tokens = torch.zeros(2, 3, dtype=torch.long)
    profile = flop_profile(model, [tokens], "tied", 2, RATE)
    assert [p for m in profile.modules for p, _ in m.params] == ["0.weight"]
    assert profile.numel == 40
    assert profile.forward_s == pytest.approx(2 * 6 * 4 * 10 / 1e9)  # the head's matmul kept


def _profile(*times: tuple[float, float], numel: int = 6) -> ComputeProfile:
    return ComputeProfile("toy", "stated", 2, [
        ModuleCost(f"m{i}", [(f"m{i}.w", [numel])], f, b) for i, (f, b) in enumerate(times)],
        update_s=0.05)


def test_merged_keeps_order_and_totals() -> None:
    profile = _profile(*[(0.001 * i, 0.002 * i) for i in range(1, 9)])
    runs = merged(profile.modules, 3)
    assert len(runs) <= 3
    assert [p for r in runs for p, _ in r.params] == [f"m{i}.w" for i in range(8)]
    assert sum(r.forward_s for r in runs) == pytest.approx(profile.forward_s)
    assert merged(profile.modules, 20) == profile.modules


def test_replayed_gradients_are_patterns_times_the_output_gradient_in_backward_order() -> None:
    profile = _profile((0.0, 0.02), (0.0, 0.02), (0.0, 0.02))
    model = ProfileModel(profile, scale=2, seed=3)
    assert [p.numel() for p in model.parameters()] == [3, 3, 3]  # 6 elements each, k = 2
    ready: dict[int, float] = {}

    def stamp(index: int) -> None:
        ready[index] = time.perf_counter()

    for index, p in enumerate(model.parameters()):
        p.register_post_accumulate_grad_hook(lambda _, i=index: stamp(i))
    x, y = replay_batch(4, step=0, rank=1)
    started = time.perf_counter()
    replay_loss(model(x), y).backward()
    scale = float(y.sum() / y.numel())
    for unit, p in zip(model.units, model.parameters(), strict=True):
        assert isinstance(unit, ReplayedModule) and p.grad is not None
        assert torch.allclose(p.grad, unit.patterns[0] * scale)
    # Backward runs the last module first, each after its 20 ms.
    assert ready[2] < ready[1] < ready[0]
    assert ready[0] - started == pytest.approx(0.06, abs=0.03)
    same = ProfileModel(profile, scale=2, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters(),
                                                  strict=True))


def test_the_device_queue_absorbs_host_work_that_stays_ahead() -> None:
    """Forward runs to deadlines: 5 modules of 10 ms take about 50 ms, not 50 ms plus the
    host's work between them."""
    model = ProfileModel(_profile(*[(0.01, 0.0)] * 5))
    x, _ = replay_batch(2, 0, 0)
    started = time.perf_counter()
    model(x)
    assert time.perf_counter() - started == pytest.approx(0.05, abs=0.02)


def test_the_sleeping_optimizer_sleeps_its_share_of_the_update() -> None:
    model = ProfileModel(_profile((0.0, 0.0), (0.0, 0.0)))
    params = list(model.parameters())
    cls = sleeping_optimizer(torch.optim.SGD, 0.2, sum(p.numel() for p in params))
    for p in params:
        p.grad = torch.ones_like(p)
    half = cls(params[:1], lr=0.1)  # type: ignore[call-arg]
    started = time.perf_counter()
    half.step()
    assert time.perf_counter() - started == pytest.approx(0.1, abs=0.04)
    assert isinstance(half, torch.optim.SGD)
    assert models.optimizer_class(model, torch.optim.SGD).__name__ == "ReplayedSGD"
    assert models.optimizer_class(nn.Linear(2, 2), torch.optim.SGD) is torch.optim.SGD


def test_profile_specs_are_read_and_refused_clearly(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile((0.001, 0.002)).to_json()))
    spec = models.model_name(f"profile:{path}?k=4&units=2&dilate=3")
    assert isinstance(spec, ProfileSpec) and (spec.scale, spec.units, spec.dilation) == (4, 2, 3)
    built = models.build(spec)
    assert isinstance(built, ProfileModel)
    assert built.profile.forward_s == pytest.approx(0.003)
    assert built.profile.update_s == pytest.approx(0.15)
    with pytest.raises(ValueError, match="k=<byte scale>"):
        ProfileSpec.parse(f"profile:{path}?k=0")
    with pytest.raises(ValueError, match="k=<byte scale>"):
        ProfileSpec.parse(f"profile:{path}?rate=4")
    with pytest.raises(ValueError, match="cannot read"):
        ProfileSpec.parse(f"profile:{tmp_path / 'missing.json'}")
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a compute profile"):
        ProfileSpec.parse(f"profile:{path}")
