"""PowerSGD and top-k: the math against float64 references (no processes), the API and knobs,
the plans that carry the factors, and training in a world of one (state_dict resume)."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched import Compression, ConfigError
from commsched.compression import PowerSGD, TopK
from commsched.compression_math import initial_q, orthogonalise_, simulate_powersgd, simulate_topk
from commsched.config import Policy, load_config
from commsched.plan import NetModel, Profile, TensorSpec, make_plan
from commsched.plan.compressed import WireLayout, check_order, compressed_plan

WORLD = 3


def _grads(step: int, shape: tuple[int, ...] = (12, 9)) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(*shape, generator=gen) for _ in range(WORLD)]


# -- float64 references, written independently of the implementation -----------------------------

def _powersgd_reference(grads_per_step: list[list[torch.Tensor]], q0: torch.Tensor
                        ) -> list[torch.Tensor]:
    """Averages of each step in float64: Q from the projector P P^T (QR: any orthonormal basis
    of span(P) gives the same approximation and the same next span)."""
    residuals = [torch.zeros_like(g, dtype=torch.float64) for g in grads_per_step[0]]
    q = q0.double()
    out = []
    for grads in grads_per_step:
        ms = [g.double() + e for g, e in zip(grads, residuals, strict=True)]
        mean = torch.stack(ms).mean(0)
        basis, _ = torch.linalg.qr(mean @ q)
        approx = basis @ basis.T @ mean
        q = mean.T @ basis
        residuals = [m - approx for m in ms]
        out.append(approx)
    return out


def _topk_reference(grads_per_step: list[list[torch.Tensor]], k: int) -> list[torch.Tensor]:
    residuals = [torch.zeros_like(g, dtype=torch.float64) for g in grads_per_step[0]]
    out = []
    for grads in grads_per_step:
        ms = [g.double() + e for g, e in zip(grads, residuals, strict=True)]
        sent = []
        for m in ms:
            threshold = m.abs().flatten().sort(descending=True).values[k - 1]
            sent.append(torch.where(m.abs() >= threshold, m, torch.zeros_like(m)))
        out.append(torch.stack(sent).mean(0))
        residuals = [m - s for m, s in zip(ms, sent, strict=True)]
    return out


@pytest.mark.parametrize("steps", [1, 3])
def test_powersgd_matches_float64_reference(steps: int) -> None:
    q0 = initial_q(9, 2, seed=0, dtype=torch.float32)
    per_step = [_grads(s) for s in range(steps)]
    expected = _powersgd_reference(per_step, q0)
    residuals = [torch.zeros(12, 9) for _ in range(WORLD)]
    q = q0.clone()
    for grads, want in zip(per_step, expected, strict=True):
        approx, residuals, q = simulate_powersgd(grads, residuals, q)
        torch.testing.assert_close(approx.double(), want, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(approx, torch.stack(per_step[-1]).mean(0), atol=1e-2)  # lossy


@pytest.mark.parametrize("steps", [1, 3])
def test_topk_matches_float64_reference(steps: int) -> None:
    per_step = [_grads(s) for s in range(steps)]
    expected = _topk_reference(per_step, k=10)
    residuals = [torch.zeros(12, 9) for _ in range(WORLD)]
    for grads, want in zip(per_step, expected, strict=True):
        average, residuals = simulate_topk(grads, residuals, k=10)
        torch.testing.assert_close(average.double(), want, rtol=1e-6, atol=1e-6)
        # Error feedback: what was not sent is kept, nothing is lost overall.
    sent_total = sum(expected) * WORLD
    grads_total = sum(sum(g.double() for g in grads) for grads in per_step)
    kept = sum(r.double() for r in residuals)
    torch.testing.assert_close(sent_total + kept, grads_total, rtol=1e-5, atol=1e-5)


def test_full_rank_powersgd_is_exact() -> None:
    """rank >= min(n, m): the factors span the gradient, the average is reproduced exactly
    (also when the gradient's own rank is lower: Note [Dependent columns of P])."""
    low = [torch.randn(12, 2) @ torch.randn(2, 9) for _ in range(WORLD)]
    for grads in (_grads(0), low):
        q = initial_q(9, 9, seed=1, dtype=torch.float32)
        approx, residuals, _ = simulate_powersgd(grads, [torch.zeros(12, 9)] * WORLD, q)
        torch.testing.assert_close(approx, sum(grads) / WORLD, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sum(residuals), torch.zeros(12, 9), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_orthogonalise_gives_an_orthonormal_basis_that_contains_p(dtype: torch.dtype) -> None:
    """Also with a zero and a dependent column (Note [Dependent columns of P])."""
    p = torch.zeros(5, 4, dtype=dtype)
    p[:, 0] = torch.arange(5.0)
    p[:, 1] = 2 * p[:, 0]
    p[:, 3] = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0])
    given = p.double().clone()
    basis = orthogonalise_(p).double()
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(basis.T @ basis, torch.eye(4, dtype=torch.float64),
                               rtol=0, atol=tolerance)
    torch.testing.assert_close(basis @ basis.T @ given, given, rtol=0, atol=tolerance * 10)


def test_orthogonalise_keeps_a_non_finite_column_non_finite() -> None:
    """An overflowing step must still show in the rebuilt gradient, whatever QR makes of it."""
    p = torch.randn(6, 3)
    p[2, 1] = float("inf")
    assert not torch.isfinite(orthogonalise_(p)[:, 1]).any()


def test_topk_warm_up_stages_follow_dgc() -> None:
    """DGC's sparsities 75%, 93.75%, 98.4375%, 99.6%, 99.9% over the warm-up, evenly; no
    warm-up, or a ratio of 25% or more: one stage."""
    stages = TopK(0.001, start_step=10, warmup_steps=100).stages()
    assert [first for first, _ in stages] == [10, 35, 60, 85, 110]
    assert [round(1 - share, 6) for _, share in stages] == \
        [0.75, 0.9375, 0.984375, 0.996094, 0.999]
    # Shorter than its stages: the densest of those starting together, 25% first.
    assert TopK(0.001, warmup_steps=2).stages() == ((0, 0.25), (1, 0.015625), (2, 0.001))
    assert TopK(0.01, start_step=5).stages() == ((5, 0.01),)
    assert TopK(0.3, warmup_steps=50).stages() == ((0, 0.3),)
    assert TopK(0.01, warmup_steps=9).label == "topk(ratio=0.01,warmup_steps=9)"
    assert TopK(0.01, warmup_steps=9).k(1000, 0.25) == 250 and TopK(0.01).k(1000) == 10
    with pytest.raises(ConfigError, match="warmup_steps=-1"):
        Compression.topk(warmup_steps=-1)


def test_which_tensors_compress() -> None:
    psgd = PowerSGD(rank=4, min_ratio=2.0)
    assert not psgd.compresses((1000,))  # 1-D: never
    assert psgd.compresses((64, 64))  # 4 * 128 * 2 <= 4096
    assert not psgd.compresses((8, 8))  # 4 * 16 * 2 > 64
    assert not PowerSGD(rank=4, min_ratio=0.0).compresses((0, 64))  # nothing to send
    assert psgd.compresses((16, 3, 3, 3)) is (4 * (16 + 27) * 2 <= 16 * 27)
    topk = TopK(ratio=0.01)
    assert topk.k(1000) == 10 and topk.compresses((1000,)) and not topk.compresses((3,))


def _ANY(value: Any) -> Any:  # a wrong type on purpose
    return value


# -- API and knobs -------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [lambda: Compression.powersgd(rank=0),
                                  lambda: Compression.powersgd(rank=_ANY(1.5)),
                                  lambda: Compression.powersgd(start_step=-1),
                                  lambda: Compression.powersgd(min_ratio=0.5),
                                  lambda: Compression.topk(ratio=0),
                                  lambda: Compression.topk(ratio=1.5),
                                  lambda: Compression.topk(ratio=_ANY("a lot"))])
def test_bad_arguments_raise_one_clear_error(call: Any) -> None:
    with pytest.raises(ConfigError, match=r"Compression\.(powersgd|topk)\(\) argument"):
        call()


def test_knobs_env_and_yaml(tmp_path) -> None:
    cfg = load_config(environ={"COMMSCHED_COMPRESSION": "powersgd",
                               "COMMSCHED_POWERSGD_RANK": "4",
                               "COMMSCHED_POWERSGD_START_STEP": "10"})
    assert (cfg.compression, cfg.powersgd_rank, cfg.powersgd_start_step) == ("powersgd", 4, 10)
    path = tmp_path / "c.yaml"
    path.write_text("compression: topk\ntopk_ratio: 0.1\n")
    cfg = load_config(environ={"COMMSCHED_CONFIG": str(path)})
    assert (cfg.compression, cfg.topk_ratio) == ("topk", 0.1)
    with pytest.raises(ConfigError, match="COMMSCHED_COMPRESSION='zip'"):
        load_config(environ={"COMMSCHED_COMPRESSION": "zip"})
    with pytest.raises(ConfigError, match="COMMSCHED_TOPK_RATIO"):
        load_config(environ={"COMMSCHED_TOPK_RATIO": "2"})


# -- plans ---------------------------------------------------------------------------------------

def _specs() -> list[TensorSpec]:
    return [TensorSpec(i, f"t{i}", n, "float32", 4, i) for i, n in enumerate([300, 20, 4000, 50])]


def _layout(rank: int) -> WireLayout:
    p = (TensorSpec(4, "t0/P", 10 * rank, "float32", 4, 0),
         TensorSpec(5, "t2/P", 40 * rank, "float32", 4, 2))
    q = (TensorSpec(6, "t0/Q", 30 * rank, "float32", 4, 0),
         TensorSpec(7, "t2/Q", 100 * rank, "float32", 4, 2))
    return WireLayout(f"powersgd(rank={rank})", frozenset({0, 2}), p, q, source={4: 0, 5: 2})


@pytest.mark.parametrize("policy", [Policy.HOROVOD, Policy.DDP, Policy.MGWFBP])
def test_compressed_plans_put_p_before_q(policy: Policy) -> None:
    cfg = load_config({"fusion_threshold": 200, "bucket_bytes": 200, "first_bucket_bytes": 100},
                      environ={})
    profile = Profile((0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0))
    plans = [compressed_plan(lambda s, p: make_plan(policy, s, p, NetModel(), cfg),
                             _specs(), _layout(r), profile) for r in (1, 2)]
    for rank, plan in zip((1, 2), plans, strict=True):
        check_order(plan, _layout(rank))
        ids = sorted(piece.tensor_id for b in plan.blocks for piece in b.pieces)
        assert sorted(set(ids)) == [1, 3, 4, 5, 6, 7]  # compressed gradients are in no block
        assert [b.block_id for b in plan.blocks] == list(range(len(plan.blocks)))
        assert plan.policy == f"{policy.value}+powersgd(rank={rank})"
    assert plans[0].fingerprint != plans[1].fingerprint  # the factors' shapes are fingerprinted


# -- training in a world of one ------------------------------------------------------------------

def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    opt.zero_grad()
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(step))
    model(x).square().mean().backward()
    opt.step()


def _wrap(net: nn.Module, compression: Any, **kw: Any) -> Any:
    return commsched.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        named_parameters=net.named_parameters(), compression=compression,
        profile_steps=kw.pop("profile_steps", 2), **kw)


def _train(compression: Any, steps: int = 5, check_plan: bool = False,
           **kw: Any) -> list[torch.Tensor]:
    """With model= (`kw`), the model trained is that one: the overlap policies need it."""
    model = kw.get("model") or _model()
    opt = _wrap(model, compression, **kw)
    passes = kw.get("backward_passes_per_step", 1)
    for step in range(steps):
        opt.zero_grad()
        for extra in range(passes):  # gradients accumulate locally over the passes
            x = torch.randn(8, 20, generator=torch.Generator().manual_seed(step + 50 * extra))
            model(x).square().mean().backward()
        opt.step()
    if check_plan:
        policy = kw.get("policy", "horovod")
        assert "+" + compression.label in opt.plan.policy, opt.plan.policy
        overlap = Policy(policy).overlaps_iterations
        assert opt.session.mode.defers_updates == overlap, (policy, opt.plan.policy)
    opt.flush()
    opt.session.close()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("passes", [1, 2])
def test_full_rank_training_reproduces_uncompressed(passes: int) -> None:
    plain = _train(Compression.none, backward_passes_per_step=passes)
    full = _train(PowerSGD(rank=30, min_ratio=0.0), backward_passes_per_step=passes)
    low = _train(Compression.powersgd(rank=1, min_ratio=1))
    for a, b in zip(full, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(low, plain, strict=True))


@pytest.mark.parametrize("policy", ["horovod", "bytescheduler"])
@pytest.mark.parametrize("compression", [Compression.powersgd(rank=2, min_ratio=1, start_step=3),
                                         Compression.topk(ratio=0.1),
                                         Compression.topk(ratio=0.1, start_step=4),
                                         Compression.topk(ratio=0.05, warmup_steps=6)],
                         ids=["powersgd", "topk", "topk-saved-at-its-start",
                              "topk-saved-in-its-warm-up"])
def test_resumed_run_is_bit_identical(compression: Any, policy: str) -> None:
    """Also under an overlap plan, whose last updates are applied (flush) before saving. Top-k
    saved at its start_step, before its first compressed step: the resumed run's velocities
    start from SGD's momentum too (Note [DGC under the user's momentum]). Top-k saved in the
    second stage of its warm-up, resumed into its last (Note [Each warm-up stage has its own
    wire tensors])."""
    model = _model()
    opt = _wrap(model, compression, policy=policy, model=model)
    for step in range(4):
        _step(model, opt, step)
    opt.flush()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    for step in range(4, 7):
        _step(model, opt, step)
    opt.flush()
    straight = [p.detach().clone() for p in model.parameters()]
    opt.session.close()

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model = _model()
    model.load_state_dict(saved["model"])
    opt = _wrap(model, compression, policy=policy, model=model)
    opt.load_state_dict(saved["opt"])
    assert "+" in opt.plan.policy  # the compressed plan was restored
    assert opt.session.mode.defers_updates == (policy == "bytescheduler")
    for step in range(4, 7):
        _step(model, opt, step)
    opt.flush()
    opt.session.close()
    for a, b in zip(model.parameters(), straight, strict=True):
        assert torch.equal(a, b)


def test_state_of_another_compressor_is_refused() -> None:
    model = _model()
    opt = _wrap(model, Compression.topk(ratio=0.1))
    _step(model, opt, 0)
    state = opt.state_dict()
    opt.session.close()
    other = _wrap(_model(), Compression.powersgd(rank=2, min_ratio=1))
    with pytest.raises(ValueError, match="compression state"):
        other.load_state_dict(state)
    other.session.close()


@pytest.mark.parametrize("policy", [p.value for p in Policy])
@pytest.mark.parametrize("compression", [Compression.powersgd(rank=2, min_ratio=1),
                                         Compression.topk(ratio=0.1)], ids=["powersgd", "topk"])
def test_every_policy_with_each_compressor(policy: str, compression: Any) -> None:
    """Every policy trains compressed, to the parameters of the synchronous horovod plan with
    the same compressor (the overlap policies apply the same updates one forward later)."""
    plain = _train(Compression.none, steps=5, policy=policy, model=_model())
    ours = _train(compression, steps=5, policy=policy, model=_model(), check_plan=True)
    reference = _train(compression, steps=5, policy="horovod")
    assert all(torch.isfinite(p).all() for p in ours)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(ours, plain, strict=True))
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compression_named_as_the_knob_is() -> None:
    """compression="fp16" / "topk" (with its parameters as knobs), as `--knob compression=...`
    in the examples passes it; a name the knob refuses is one ConfigError naming it."""
    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression="topk", topk_ratio="0.05", topk_warmup_steps="8")
    assert opt.session.compressed is not None
    assert opt.session.compressed.lossy == TopK(0.05, 0, 8)
    opt.session.close()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        compression="fp16")
    assert opt.session.compressed is None and opt.session.options.compression is Compression.fp16
    opt.session.close()
    with pytest.raises(ConfigError, match="gzip"):
        commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression="gzip")


def test_compression_from_the_knob(monkeypatch) -> None:
    monkeypatch.setenv("COMMSCHED_COMPRESSION", "powersgd")
    monkeypatch.setenv("COMMSCHED_POWERSGD_MIN_RATIO", "1")
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         profile_steps=0)
    assert opt.plan.policy == "horovod+powersgd(rank=1)"
    opt.session.close()


def test_profile_has_the_compute_compression_adds() -> None:
    model = _model()
    opt = _wrap(model, Compression.topk(ratio=0.1), profile_steps=3)
    for step in range(3):
        _step(model, opt, step)
    document = opt.session.profile_document()
    opt.session.close()
    assert document["compute"]["compression_s"] > 0
    wire = [t for t in document["tensors"] if "topk" in t["name"]]
    assert wire == []  # the profile lists the model's tensors; wire blocks are in the samples


@pytest.mark.parametrize("compression", [Compression.powersgd(rank=2, min_ratio=1),
                                         Compression.topk(ratio=0.1)], ids=["powersgd", "topk"])
def test_profile_times_a_compressed_gradient_when_it_was_handed_over(compression: Any) -> None:
    """A compressed gradient is in no block, but the profile has its ready time (top-k
    compresses every tensor of this model and marks its wire tensors only with the last one:
    without them the profiled backward would last no time at all)."""
    model = _model()
    opt = _wrap(model, compression, profile_steps=3)
    for step in range(3):
        _step(model, opt, step)
    document = opt.session.profile_document()
    opt.session.close()
    ready = {t["name"]: t["ready_time_s"] for t in document["tensors"]}
    # Backward produces the last layer's gradients first: the first layer's weight comes later.
    assert ready["0.weight"] > ready["2.weight"] >= 0


def test_timeline_shows_the_wire_tensors_and_the_compute(tmp_path) -> None:
    import json

    model = _model()
    opt = _wrap(model, Compression.powersgd(rank=2, min_ratio=1), profile_steps=1,
                timeline=str(tmp_path / "trace.json"))
    for step in range(2):
        _step(model, opt, step)
    opt.session.close()
    events = json.loads((tmp_path / "trace.rank0.json").read_text())
    names = [e["name"] for e in events]
    assert names.count("ready:0.weight/powersgd.P") == names.count("ready:0.weight/powersgd.Q") == 2
    # The compressed gradient is in no block; its hand-over to the compressor is on the timeline.
    assert names.count("ready:0.weight") == 2
    assert {"compress", "decompress"} <= set(names)


@pytest.mark.parametrize("compression", [Compression.powersgd(rank=2, min_ratio=1),
                                         Compression.topk(ratio=0.1)], ids=["powersgd", "topk"])
def test_an_overflowing_step_does_not_poison_the_state(compression: Any) -> None:
    """AMP's loss scaler skips a step whose gradients overflowed; the compressor's state must
    come out of it finite, and the gradient must still show the overflow."""
    model = _model()
    opt = _wrap(model, compression, profile_steps=0)
    _step(model, opt, 0)
    opt.zero_grad()
    (model(torch.full((8, 20), float("inf"))).sum()).backward()
    opt.synchronize()
    assert any(not torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    state = opt.session.compressed
    assert state is not None
    assert all(torch.isfinite(e).all() for e in state.residuals)
    assert all(torch.isfinite(q).all() for q in getattr(state, "q", []))
    # The scaler skipped opt.step(); the next one warns as Horovod's does after synchronize().
    with pytest.warns(UserWarning, match="skip_synchronize"):
        _step(model, opt, 1)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    opt.session.close()
