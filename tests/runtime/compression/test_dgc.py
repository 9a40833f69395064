"""Top-k under momentum (issue 55, item 3): DGC's momentum correction and masking against
float64 references written independently of the implementation, momentum applied once, plain
error feedback without momentum, and the warning where no correction applies. A world of one:
the 2-rank run and the least-squares convergence check are in test_dgc_dist.py."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import commsched
from commsched import Compression
from commsched.compression import TopK
from commsched.compression_math import sgd_momentum_factor, simulate_dgc

WORLD = 3
LR, WD = 0.1, 0.01


# -- float64 references --------------------------------------------------------------------------

def _top(m: torch.Tensor, k: int) -> torch.Tensor:
    """Where m's k largest magnitudes are (a threshold, not torch.topk)."""
    threshold = m.abs().flatten().sort(descending=True).values[k - 1]
    return m.abs() >= threshold


def _k_at(k: int | list[int], step: int) -> int:
    return k if isinstance(k, int) else k[step]


def dgc_reference(grads_per_step: list[list[torch.Tensor]], k: int | list[int], momentum: float,
                  nesterov: bool = False, start: torch.Tensor | None = None
                  ) -> list[torch.Tensor]:
    """Lin et al.'s algorithm: per rank u = m u + g, v = v + u, send top-k of v, clear v and u
    where sent; the update is the average of what was sent. Float64. `start`: every rank's
    first u (zero by default). `k`: one for every step, or one per step (a warm-up)."""
    us = [torch.zeros_like(g, dtype=torch.float64) if start is None else start.clone()
          for g in grads_per_step[0]]
    vs = [torch.zeros_like(u) for u in us]
    out = []
    for step, grads in enumerate(grads_per_step):
        sent = []
        for r, g in enumerate(grads):
            g = g.double()
            us[r] = momentum * (us[r] + g) if nesterov else momentum * us[r] + g
            vs[r] = vs[r] + us[r] + (g if nesterov else 0)
            mask = _top(vs[r], _k_at(k, step))
            sent.append(torch.where(mask, vs[r], 0.0))
            vs[r] = torch.where(mask, 0.0, vs[r])
            us[r] = torch.where(mask, 0.0, us[r])
        out.append(torch.stack(sent).mean(0))
    return out


def ef_reference(grads_per_step: list[list[torch.Tensor]], k: int | list[int]
                 ) -> list[torch.Tensor]:
    """Plain error feedback: send top-k of g + e, keep the rest in e. Float64."""
    es = [torch.zeros_like(g, dtype=torch.float64) for g in grads_per_step[0]]
    out = []
    for step, grads in enumerate(grads_per_step):
        sent = []
        for r, g in enumerate(grads):
            m = g.double() + es[r]
            mask = _top(m, _k_at(k, step))
            sent.append(torch.where(mask, m, 0.0))
            es[r] = torch.where(mask, 0.0, m)
        out.append(torch.stack(sent).mean(0))
    return out


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(12, 9, generator=gen) for _ in range(WORLD)]


@pytest.mark.parametrize("nesterov", [False, True])
def test_simulate_dgc_matches_float64_reference(nesterov: bool) -> None:
    per_step = [_grads(s) for s in range(4)]
    expected = dgc_reference(per_step, k=10, momentum=0.9, nesterov=nesterov)
    us = [torch.zeros(12, 9) for _ in range(WORLD)]
    vs = [torch.zeros(12, 9) for _ in range(WORLD)]
    for grads, want in zip(per_step, expected, strict=True):
        reduced, us, vs = simulate_dgc(grads, us, vs, k=10, momentum=0.9, nesterov=nesterov)
        torch.testing.assert_close(reduced.double(), want, rtol=1e-5, atol=1e-5)


def test_full_density_dgc_sends_the_gradient() -> None:
    """Every entry sent at every step: masking clears each velocity, the update is the plain
    average (DGC as published; Note [DGC under the user's momentum])."""
    for grads, want in zip(dgc_reference([_grads(s) for s in range(3)], 108, 0.9),
                           [torch.stack(_grads(s)).double().mean(0) for s in range(3)],
                           strict=True):
        torch.testing.assert_close(grads, want)


@pytest.mark.parametrize(("momentum", "dampening", "nesterov"),
                         [(0.9, 0.0, False), (0.9, 0.3, False), (0.9, 0.0, True)])
def test_handed_gradient_makes_sgd_step_by_the_update(momentum: float, dampening: float,
                                                      nesterov: bool) -> None:
    """torch's SGD with a zeroed (or absent) buffer turns X / f - wd p into the update X."""
    x, p = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    for first_step in (True, False):
        param = p.clone().requires_grad_()
        opt = torch.optim.SGD([param], lr=LR, momentum=momentum, dampening=dampening,
                              nesterov=nesterov, weight_decay=WD)
        if not first_step:
            opt.state[param]["momentum_buffer"] = torch.zeros_like(p)
        factor = sgd_momentum_factor(momentum, dampening, nesterov, first_step)
        param.grad = x / factor - WD * p
        opt.step()
        torch.testing.assert_close(param.detach(), p - LR * x)


# -- the runtime in a world of one, against the references ----------------------------------------

class _Everything(TopK):
    """Top-k that compresses every tensor, at any ratio (ratio 1: every entry sent)."""

    def compresses(self, shape: Any) -> bool:
        return math.prod(shape) > 0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(8, 20, generator=torch.Generator().manual_seed(step))


def _run(lossy: Any, steps: int = 5, policy: str = "horovod", **sgd: Any) -> list[torch.Tensor]:
    model = _model()
    opt = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, **sgd),
        named_parameters=model.named_parameters(), compression=lossy, profile_steps=2,
        policy=policy, model=model)
    for step in range(steps):
        opt.zero_grad()
        model(_batch(step)).square().mean().backward()
        opt.step()
    opt.flush()
    opt.session.close()
    return [p.detach().clone() for p in model.parameters()]


def _reference_run(lossy: TopK, steps: int = 5, momentum: float = 0.0, nesterov: bool = False,
                   weight_decay: float = 0.0) -> list[torch.Tensor]:
    """Float64: DGC (momentum > 0) or plain error feedback on the compressed tensors, whose
    update is lr x the exchanged value (weight decay inside DGC's gradient); the rest by
    torch's SGD with the same hyper-parameters. Before `lossy.start_step`, every tensor by
    that SGD; DGC's u then starts from SGD's buffer b (Nesterov: m b). Each step's k is
    that of its share sent: DGC's warm-up, stages written out here from the paper's rule
    (25% first, a quarter of the previous share per stage, the warm-up split evenly)."""
    model = _model().double()
    params = list(model.parameters())
    compressed = [p for p in params if lossy.compresses(p.shape)]
    rest = [p for p in params if not lossy.compresses(p.shape)]
    opt = torch.optim.SGD(rest, lr=LR, momentum=momentum, nesterov=nesterov,
                          weight_decay=weight_decay) if rest else None
    history: dict[int, list[list[torch.Tensor]]] = {id(p): [] for p in compressed}
    warm_up = torch.optim.SGD(compressed, lr=LR, momentum=momentum, nesterov=nesterov,
                              weight_decay=weight_decay)
    for step in range(steps):
        model.zero_grad()
        model(_batch(step).double()).square().mean().backward()
        if step < lossy.start_step:
            warm_up.step()
        compressed_now = compressed if step >= lossy.start_step else []
        buffers = {id(p): warm_up.state[p].get("momentum_buffer") for p in compressed}
        with torch.no_grad():
            for p in compressed_now:
                assert p.grad is not None
                history[id(p)].append([p.grad + weight_decay * p if momentum else p.grad])
                k = [math.ceil(_share(lossy, s) * p.numel())
                     for s in range(lossy.start_step, step + 1)]
                buffer = buffers[id(p)]
                start = None if buffer is None else buffer * (momentum if nesterov else 1.0)
                updates = dgc_reference(history[id(p)], k, momentum, nesterov, start) \
                    if momentum else ef_reference(history[id(p)], k)
                direction = updates[-1] if momentum else updates[-1] + weight_decay * p
                p.grad = None
                p.sub_(LR * direction)
        if opt is not None:
            opt.step()
    return [p.detach() for p in params]


def _share(lossy: TopK, step: int) -> float:
    """DGC's warm-up, independently of TopK.stages(): stage i of n ramp stages (shares 1/4,
    1/16, ... above the ratio) starts i x warmup // n steps after the start."""
    shares = [0.25 / 4**i for i in range(20) if 0.25 / 4**i > lossy.ratio] \
        if lossy.warmup_steps else []
    since = step - lossy.start_step
    if since >= lossy.warmup_steps or not shares:
        return lossy.ratio
    starts = [i * lossy.warmup_steps // len(shares) for i in range(len(shares))]
    return shares[starts.index(max(f for f in starts if f <= since))]  # densest of a tie


def _close(ours: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(ours, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("sgd", "ratio"), [({"momentum": 0.9, "weight_decay": WD}, 0.1),
                                            ({"momentum": 0.9, "nesterov": True}, 0.2),
                                            ({"weight_decay": WD}, 0.1)],
                         ids=["momentum", "nesterov", "no-momentum"])
def test_runtime_matches_float64_reference(sgd: dict[str, Any], ratio: float) -> None:
    """Momentum SGD: DGC, the user's momentum not applied again; no momentum: plain error
    feedback. The uncompressed biases keep the user's momentum SGD."""
    lossy = TopK(ratio)
    _close(_run(lossy, **sgd), _reference_run(lossy, **sgd))


@pytest.mark.parametrize(("nesterov", "policy"), [(False, "horovod"), (True, "horovod"),
                                                  (False, "bytescheduler")])
def test_a_warm_up_hands_sgds_momentum_to_dgc(nesterov: bool, policy: str) -> None:
    """Compression.topk(start_step=3): three steps of plain momentum SGD, then DGC whose
    velocities start from SGD's buffers (Note [DGC under the user's momentum]). Under an
    overlap plan the buffers are read after the updates deferred into the forward pass."""
    lossy = TopK(0.1, start_step=3)
    sgd: dict[str, Any] = {"momentum": 0.9, "nesterov": nesterov,
                           "weight_decay": 0.0 if nesterov else WD}
    _close(_run(lossy, steps=6, policy=policy, **sgd), _reference_run(lossy, steps=6, **sgd))


@pytest.mark.parametrize(("lossy", "policy", "sgd"), [
    (TopK(0.01, warmup_steps=4), "horovod", {"momentum": 0.9, "weight_decay": WD}),
    (TopK(0.01, start_step=2, warmup_steps=3), "bytescheduler", {"momentum": 0.9}),
    (TopK(0.01, warmup_steps=4), "horovod", {"weight_decay": WD}),
    (TopK(0.01, warmup_steps=6), "auto", {"momentum": 0.9})],
    ids=["dgc", "dgc-after-a-dense-start-overlap", "error-feedback", "auto-simulates-stages"])
def test_the_sparsity_warm_up_matches_float64_reference(lossy: TopK, policy: str,
                                                        sgd: dict[str, Any]) -> None:
    """DGC's warm-up (warmup_steps): 25%, 6.25%, 1.5625% then 1% sent, each stage on its own
    wire tensors under a rebuilt plan, residuals and velocities carried across the stages.
    `auto` simulates its candidates while the stages change (the other stages' tensors are
    no gradients to plan)."""
    assert len(lossy.stages()) == 4
    _close(_run(lossy, steps=7, policy=policy, **sgd), _reference_run(lossy, steps=7, **sgd))


def _wrapped(net: nn.Module, lossy: Any, **knobs: Any) -> Any:
    """Momentum SGD under `lossy`, profiled for two steps."""
    return commsched.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9),
        named_parameters=net.named_parameters(), compression=lossy, profile_steps=2, **knobs)


def test_each_warm_up_stage_gathers_its_own_share() -> None:
    """The plan in force carries the stage's wire tensors only; the others hold no memory."""
    lossy = Compression.topk(0.01, warmup_steps=4)
    model = _model()
    opt = _wrapped(model, lossy)
    sizes = [p.numel() for p in model.parameters() if lossy.compresses(p.shape)]
    assert sizes == [600, 30, 150, 5]  # at 1%, each sends a quarter of its bytes or less
    gathered = []
    for step in range(6):
        opt.zero_grad()
        model(_batch(step)).square().mean().backward()
        opt.step()  # the stage of the next iteration is in force after it
        blocks = [b for b in opt.plan.blocks if b.op.name == "ALL_GATHER"]
        gathered.append(sum(p.numel for b in blocks for p in b.pieces if b.dtype == "float32"))
        assert opt.session.compressed is not None and opt.session.compressed.topk is not None
        stages = opt.session.compressed.topk
        # Only the stage in force may hold memory (it allocates at its first hand-over).
        assert not any(w.values for i, w in enumerate(stages.wires) if i != stages.position)
    opt.session.close()
    shares = [0.0625, 0.015625, 0.015625, 0.01, 0.01, 0.01]  # iterations 1 to 6
    assert gathered == [sum(math.ceil(s * n) for n in sizes) for s in shares], gathered


def _wire_ids(opt: Any) -> tuple[list[int], list[int]]:
    """The wire tensors the installed plan carries, and those of the stage in force."""
    compressed = opt.session.compressed
    planned = sorted(p.tensor_id for b in opt.plan.blocks for p in b.pieces
                     if p.tensor_id >= len(opt.session.specs))
    return planned, sorted(s.tensor_id for s in compressed.layout.gathered)


def test_nothing_is_allocated_before_compression_starts() -> None:
    lossy = Compression.topk(0.01, start_step=3, warmup_steps=9)  # 25% from 3 to 5
    model = _model()
    opt = _wrapped(model, lossy)
    held = []
    for step in range(5):
        opt.zero_grad()
        model(_batch(step)).square().mean().backward()
        opt.step()
        compressed = opt.session.compressed
        assert compressed is not None and compressed.topk is not None
        held.append(sum(bool(w.values) for w in compressed.topk.wires))
    opt.session.close()
    assert held == [0, 0, 0, 1, 1], held  # iterations 0-2 uncompressed


def test_auto_chooses_afresh_at_each_stage() -> None:
    """A stage's plans carry its own wire: `auto` decides again, and its refinement of the
    new choice is still to come (Note [Planning from the steady state])."""
    lossy = Compression.topk(0.01, warmup_steps=60)  # stages at 0, 20, 40, then 60
    model = _model()
    opt = _wrapped(model, lossy, policy="auto", model=model, timeout=20)
    lifecycle = opt.session.lifecycle
    auto = lifecycle.auto
    assert auto is not None
    for step in range(140):
        opt.zero_grad()
        model(_batch(step)).square().mean().backward()
        opt.step()
        planned, layout = _wire_ids(opt)
        assert planned == layout, (step, planned, layout)
        if opt.session.state.iteration in (20, 40, 60):  # a stage began
            assert not auto.refined and lifecycle.replan_at is None
    assert auto.refined  # the last stage's choice was refined
    opt.session.close()


def test_auto_restored_where_a_stage_begins_installs_its_wire() -> None:
    """A checkpoint saved in `auto`'s refinement window whose re-plan falls where a stage
    begins: the restored run has no ranking to refine, so the stage's plan is built then
    (before, the old stage's plan stayed and the next step waited for the new wire)."""
    lossy = Compression.topk(0.01, warmup_steps=12)  # stages at 0, 4, 8, then 12
    model = _model()
    opt = _wrapped(model, lossy, policy="auto", model=model, timeout=10)
    for step in range(10):
        if step == 5:
            state = opt.state_dict()
            state["commsched"]["replan_at"] = 8  # a refinement due where stage 3 begins
            state["commsched"]["auto"]["refining"] = True
            opt.load_state_dict(state)
        opt.zero_grad()
        model(_batch(step)).square().mean().backward()
        opt.step()
        planned, layout = _wire_ids(opt)
        assert planned == layout, (step, planned, layout)
    opt.session.close()


def test_the_first_compressed_step_moves_sent_entries_as_sgd_would() -> None:
    """At the switch, an entry sent moves by SGD's own momentum update, bit for bit to float
    tolerance: no momentum lost. Entries not sent stay where they were."""
    lossy = Compression.topk(0.1, start_step=3)
    before = _run(lossy, steps=3, momentum=0.9)
    after = _run(lossy, steps=4, momentum=0.9)
    plain = _run(Compression.none, steps=4, momentum=0.9)
    weight = 0  # the first Linear's weight, compressed (the biases are not)
    moved = after[weight] != before[weight]
    assert 0 < int(moved.sum()) < moved.numel()
    torch.testing.assert_close(after[weight][moved], plain[weight][moved])
    torch.testing.assert_close(before[weight], _run(Compression.none, steps=3, momentum=0.9)[0])


def test_momentum_is_applied_once() -> None:
    """Every entry sent at every step under SGD(momentum=0.9): DGC clears every velocity, so the
    run is plain SGD, bit for bit to float tolerance. Had the user's momentum acted too, it
    would be momentum SGD (the last line checks that this differs)."""
    everything = _Everything(ratio=1.0)
    ours = _run(everything, momentum=0.9, weight_decay=WD)
    _close(ours, [p.double() for p in _run(Compression.none, weight_decay=WD)])
    with_momentum = _run(Compression.none, momentum=0.9, weight_decay=WD)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(ours, with_momentum,
                                                                    strict=True))


# -- warnings ------------------------------------------------------------------------------------

def _wrap_warnings(opt_cls: type, lossy: Any, **hyper: Any) -> list[str]:
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = commsched.DistributedOptimizer(opt_cls(model.parameters(), lr=LR, **hyper),
                                             named_parameters=model.named_parameters(),
                                             compression=lossy, profile_steps=0)
    opt.session.close()
    return [str(w.message) for w in caught if "error feedback" in str(w.message)]


@pytest.mark.parametrize(("opt_cls", "hyper", "why"), [
    (torch.optim.Adam, {}, "Adam with betas[0]=0.9"),
    (torch.optim.AdamW, {}, "AdamW with betas[0]=0.9"),
    (torch.optim.RMSprop, {"momentum": 0.5}, "RMSprop with momentum=0.5"),
    (torch.optim.SGD, {"momentum": 0.9, "maximize": True}, "maximize=True")])
def test_uncorrected_momentum_warns_once(opt_cls: type, hyper: dict[str, Any], why: str) -> None:
    caught = _wrap_warnings(opt_cls, Compression.topk(0.1), **hyper)
    assert len(caught) == 1 and why in caught[0], caught


@pytest.mark.parametrize(("opt_cls", "lossy", "hyper"), [
    (torch.optim.SGD, Compression.topk(0.1), {"momentum": 0.9}),
    (torch.optim.SGD, Compression.topk(0.1), {}),
    (torch.optim.RMSprop, Compression.topk(0.1), {}),
    (torch.optim.SGD, Compression.powersgd(rank=2, min_ratio=1), {"momentum": 0.9}),
    (torch.optim.Adam, Compression.powersgd(rank=2, min_ratio=1), {})],
    ids=["topk-sgd-momentum", "topk-sgd", "topk-rmsprop", "powersgd-sgd", "powersgd-adam"])
def test_no_warning_where_the_method_is_fine(opt_cls: type, lossy: Any,
                                             hyper: dict[str, Any]) -> None:
    assert _wrap_warnings(opt_cls, lossy, **hyper) == []
