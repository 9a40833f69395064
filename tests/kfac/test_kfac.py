"""K-FAC in one process: preconditioned gradients against a float64 reference written from the
formulas (docs/kfac.md) with an explicit Kronecker product, placement against brute force,
KL clipping, checkpoints and argument errors."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
import torch
from torch import nn

from commsched.kfac import KFACPreconditioner, Placement, assign, lpt, makespan, round_robin
from commsched.kfac import factors as fx

DAMPING = 0.05


def _patches(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """Rows of input patches by explicit slicing (independent of F.unfold)."""
    assert not isinstance(conv.padding, str)  # numeric padding ("same" is not used here)
    (kh, kw), (sh, sw), (ph, pw) = conv.kernel_size, conv.stride, conv.padding
    padded = nn.functional.pad(x, (pw, pw, ph, ph))
    out_h = (padded.shape[2] - kh) // sh + 1
    out_w = (padded.shape[3] - kw) // sw + 1
    rows = []
    for n in range(x.shape[0]):
        for i in range(out_h):
            for j in range(out_w):
                rows.append(padded[n, :, i * sh:i * sh + kh, j * sw:j * sw + kw].reshape(-1))
    return torch.stack(rows)


def _outer_sum(rows: torch.Tensor) -> torch.Tensor:
    """The sum of r r^T over the rows r, one outer product at a time."""
    total = torch.zeros(rows.shape[1], rows.shape[1], dtype=rows.dtype)
    for r in rows:
        total = total + torch.outer(r, r)
    return total


def _present(tensor: torch.Tensor | None) -> torch.Tensor:
    """A gradient or factor that must exist by now."""
    assert tensor is not None
    return tensor


def _linear(net: nn.Sequential, index: int) -> nn.Linear:
    layer = net[index]
    assert isinstance(layer, nn.Linear)
    return layer


def _reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               method: str) -> dict[nn.Module, torch.Tensor]:
    """Per layer: solve (G (x) A + damping) vec(P) = vec(M) (eigen) or (G + sqrt(d) I) (x)
    (A + sqrt(d) I) vec(P) = vec(M) (inverse), with A, G from per-row outer products."""
    inputs: dict[nn.Linear | nn.Conv2d, torch.Tensor] = {}
    outputs: dict[nn.Module, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        assert isinstance(module, nn.Linear | nn.Conv2d)
        inputs[module] = args[0]
        output.retain_grad()
        outputs[module] = output

    hooks = [m.register_forward_hook(keep) for m in model.modules()
             if isinstance(m, (nn.Linear, nn.Conv2d))]
    nn.functional.cross_entropy(model(x), y).backward()
    for h in hooks:
        h.remove()
    result: dict[nn.Module, torch.Tensor] = {}
    for module, inp in inputs.items():
        grad_out = _present(outputs[module].grad)
        batch = inp.shape[0]
        if isinstance(module, nn.Conv2d):
            a_rows = _patches(inp, module)
            g_rows = grad_out.permute(0, 2, 3, 1).reshape(-1, grad_out.shape[1]) * batch
        else:
            a_rows, g_rows = inp, grad_out * batch
        if module.bias is not None:
            a_rows = torch.cat([a_rows, torch.ones(a_rows.shape[0], 1, dtype=a_rows.dtype)], 1)
        a = _outer_sum(a_rows) / a_rows.shape[0]
        g = _outer_sum(g_rows) / batch  # summed over positions (KFC)
        m = _present(module.weight.grad).reshape(module.weight.shape[0], -1)
        if module.bias is not None:
            m = torch.cat([m, _present(module.bias.grad).reshape(-1, 1)], 1)
        if method == "eigen":
            system = torch.kron(g, a) + DAMPING * torch.eye(g.shape[0] * a.shape[0], dtype=a.dtype)
        else:
            root = DAMPING ** 0.5
            system = torch.kron(g + root * torch.eye(g.shape[0], dtype=g.dtype),
                                a + root * torch.eye(a.shape[0], dtype=a.dtype))
        result[module] = torch.linalg.solve(system, m.reshape(-1)).reshape(m.shape)
    return result


def _model() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Tanh(),
                         nn.Conv2d(3, 4, 2, bias=False), nn.Flatten(), nn.Linear(4 * 2 * 2, 6),
                         nn.Tanh(), nn.Linear(6, 3, bias=False)).double()


def _data(n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return (torch.randn(n, 2, 6, 6, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (n,), generator=gen))


def _preconditioned(model: nn.Module, method: str,
                    **kwargs: Any) -> tuple[KFACPreconditioner, dict[nn.Module, torch.Tensor]]:
    x, y = _data()
    precond = KFACPreconditioner(model, damping=DAMPING, kl_clip=None, compute_method=method,
                                 local_threshold=0, **kwargs)
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    precond.step()
    return precond, {m: _present(fx.gradient_matrix(m)) for m in model.modules()
                     if isinstance(m, (nn.Linear, nn.Conv2d))}


@pytest.mark.parametrize("method", ["eigen", "inverse"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_preconditioned_gradient_matches_kronecker_reference(method: str, symmetric: bool) -> None:
    reference = _reference(_model(), *_data(), method)
    precond, got = _preconditioned(_model(), method, symmetric=symmetric)
    assert len(got) == len(reference) == 4
    for (module, expected), actual in zip(reference.items(), got.values(), strict=True):
        assert torch.allclose(actual, expected, rtol=1e-8, atol=1e-10), (module, method)
    precond.shutdown()


def test_preconditioning_changes_the_gradient() -> None:
    """The reference comparison above must not pass for an identity preconditioner."""
    model = _model()
    x, y = _data()
    nn.functional.cross_entropy(model(x), y).backward()
    plain = _present(fx.gradient_matrix(model[4]))
    _, got = _preconditioned(_model(), "eigen")
    assert not torch.allclose(got[list(got)[2]], plain, rtol=1e-2)


def test_kl_clip_scales_every_layer_by_one_factor() -> None:
    _, unclipped = _preconditioned(_model(), "eigen")
    x, y = _data()
    model = _model()
    lr, kl_clip = 0.5, 1e-4
    precond = KFACPreconditioner(model, damping=DAMPING, kl_clip=kl_clip, lr=lr,
                                 local_threshold=0)
    nn.functional.cross_entropy(model(x), y).backward()
    new_modules = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    raw = [_present(fx.gradient_matrix(m)).clone() for m in new_modules]
    precond.step()
    vg = sum(float((unclipped[m] * g).sum()) for m, g in zip(unclipped, raw, strict=True)) * lr ** 2
    expected = min(1.0, math.sqrt(kl_clip / abs(vg)))
    assert expected < 1.0  # the case must actually clip
    assert precond.last_scale == pytest.approx(expected, rel=1e-9)
    for old, new in zip(unclipped, new_modules, strict=True):
        assert torch.allclose(_present(fx.gradient_matrix(new)), unclipped[old] * expected,
                              rtol=1e-8)


def _train(precond_kwargs: dict, steps: range, state: dict | None = None) -> tuple:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    precond = KFACPreconditioner(model, inv_update_steps=3, factor_update_steps=2,
                                 local_threshold=0, **precond_kwargs)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        precond.load_state_dict(state["kfac"])
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(5, 2, 6, 6, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), torch.randint(0, 3, (5,), generator=gen)).backward()
        precond.step()
        opt.step()
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "kfac": precond.state_dict()}
    precond.shutdown()
    return [p.detach().clone() for p in model.parameters()], saved


@pytest.mark.parametrize("method", ["eigen", "inverse"])
def test_checkpoint_round_trip_continues_identically(method: str, tmp_path) -> None:
    kwargs = {"compute_method": method, "damping": lambda step: 0.1 / (1 + step)}
    whole, _ = _train(kwargs, range(8))
    _, saved = _train(kwargs, range(4))  # mid-interval: inverses from step 3, factors from 2
    torch.save(saved, tmp_path / "ckpt.pt")
    resumed, _ = _train(kwargs, range(4, 8), torch.load(tmp_path / "ckpt.pt", weights_only=True))
    for a, b in zip(whole, resumed, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="compute_method"):
        other = "inverse" if method == "eigen" else "eigen"
        _train({"compute_method": other}, range(0), saved)


def test_lpt_is_within_four_thirds_of_optimum() -> None:
    rng = random.Random(11)
    for _ in range(60):
        workers = rng.choice([2, 3])
        costs = [float(rng.randint(1, 40) ** 3) for _ in range(rng.randint(workers, 7))]
        optimum = min(makespan(costs, owners, workers)
                      for owners in itertools.product(range(workers), repeat=len(costs)))
        got = makespan(costs, lpt(costs, workers), workers)
        assert optimum <= got <= (4 / 3 - 1 / (3 * workers)) * optimum + 1e-9


def test_placement_threshold_and_policies() -> None:
    dims = [("l0.A", 28), ("l0.G", 32), ("l1.A", 2049), ("l1.G", 1024), ("l2.A", 1025),
            ("l2.G", 10)]
    a = assign(dims, 2, Placement.LPT, local_threshold=32)
    assert a.local == ["l0.A", "l0.G", "l2.G"]
    assert a.owner["l1.A"] == 0 and {a.owner["l1.G"], a.owner["l2.A"]} == {1}
    rr = assign(dims, 2, Placement.ROUND_ROBIN, local_threshold=32)
    assert [rr.owner[n] for n in ("l1.A", "l1.G", "l2.A")] == [0, 1, 0]
    assert round_robin(5, 3) == [0, 1, 2, 0, 1]
    assert a.load(0) == pytest.approx(2049 ** 3)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"compute_method": "cholesky"}, "compute_method='cholesky' is not one of"),
    ({"placement": "random"}, "placement='random'"),
    ({"damping": -1.0}, "damping must be"),
    ({"factor_decay": 1.0}, "factor_decay must be"),
    ({"factor_update_steps": 0}, "factor_update_steps must be"),
    ({"local_threshold": -3}, "local_threshold must be"),
    ({"skip_layers": ("linear", "conv2d")}, "no nn.Linear or nn.Conv2d"),
])
def test_bad_arguments_name_the_argument(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KFACPreconditioner(_model(), **kwargs)


def test_unsupported_and_skipped_layers_are_left_alone() -> None:
    model = nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(32, 3),
                          nn.Linear(3, 2))
    precond = KFACPreconditioner(model, skip_layers=("3",))
    assert [layer.name for layer in precond.layers] == ["2"]
    precond.shutdown()


def test_step_without_factors_is_an_error() -> None:
    precond = KFACPreconditioner(_model())
    with pytest.raises(RuntimeError, match="no factors yet"):
        precond.step()
    precond.shutdown()


def test_half_precision_layers_get_single_precision_factors() -> None:
    """bf16 factors would lose the eigenvalues damping is compared with: factors are float32 and
    the direction matches a float32 run of the same layer up to bf16 rounding of the gradient."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    half = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(torch.bfloat16)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    x = torch.randn(16, 4).to(torch.bfloat16)
    directions = []
    for net in (model, half):
        precond = KFACPreconditioner(net, damping=DAMPING, kl_clip=None, local_threshold=0)
        net(x.to(_linear(net, 0).weight.dtype)).float().square().mean().backward()
        precond.step()
        assert precond.layers[0].a is not None and precond.layers[0].a.dtype == torch.float32
        directions.append(_present(_linear(net, 0).weight.grad).float())
        precond.shutdown()
    assert directions[1].dtype == torch.float32
    assert _present(_linear(half, 0).weight.grad).dtype == torch.bfloat16
    assert torch.allclose(directions[0], directions[1], rtol=0.05,
                          atol=0.05 * float(directions[0].abs().max()))


def _solve(a: torch.Tensor, g: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    system = torch.kron(g, a) + DAMPING * torch.eye(g.shape[0] * a.shape[0], dtype=a.dtype)
    return torch.linalg.solve(system, m.reshape(-1)).reshape(m.shape)


def test_running_averages_and_update_intervals_match_reference() -> None:
    """Three steps, factors every step with decay 0.7, decompositions at steps 0 and 2 only:
    step 1 must use step 0's decomposition, step 2 the decayed averages."""
    decay = 0.7
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    precond = KFACPreconditioner(model, damping=DAMPING, kl_clip=None, factor_decay=decay,
                                 inv_update_steps=2, local_threshold=0)
    layer = model[2]
    running: tuple[torch.Tensor, torch.Tensor] | None = None
    decomposed: tuple[torch.Tensor, torch.Tensor] | None = None
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(6, 3, generator=gen, dtype=torch.float64)
        model.zero_grad()
        hidden = model[1](model[0](x))
        hidden.retain_grad()
        out = model[2](hidden)
        out.retain_grad()
        out.square().sum().div(6).backward()
        rows_a = torch.cat([hidden.detach(), torch.ones(6, 1, dtype=torch.float64)], 1)
        rows_g = _present(out.grad) * 6
        new = (rows_a.t() @ rows_a / 6, rows_g.t() @ rows_g / 6)
        if running is not None:
            new = (decay * running[0] + (1 - decay) * new[0],
                   decay * running[1] + (1 - decay) * new[1])
        running = new
        if step % 2 == 0:
            decomposed = running
        m = _present(fx.gradient_matrix(layer)).clone()
        precond.step()
        assert decomposed is not None
        assert torch.allclose(_present(fx.gradient_matrix(layer)), _solve(*decomposed, m),
                              rtol=1e-8), step
    precond.shutdown()


def test_factors_leave_during_forward_and_backward_only_when_pipelined() -> None:
    x, y = _data()
    for pipelined in (True, False):
        model = _model()
        precond = KFACPreconditioner(model, pipelined=pipelined, local_threshold=0)
        out = model(x)
        a_names = {f"{lay.name}.A" for lay in precond.layers}
        assert precond.bound is not None
        assert set(precond.bound.factors.submitted) == (a_names if pipelined else set())
        nn.functional.cross_entropy(out, y).backward()
        assert len(precond.bound.factors.submitted) == (2 * len(precond.layers) if pipelined else 0)
        precond.step()
        precond.shutdown()


def test_layer_that_did_not_run_keeps_its_factors() -> None:
    body, head = nn.Linear(3, 3).double(), nn.Linear(3, 2).double()
    model = nn.ModuleDict({"body": body, "head": head})
    precond = KFACPreconditioner(model, factor_decay=0.5, local_threshold=0)
    x = torch.randn(5, 3, dtype=torch.float64)
    head(body(x)).sum().backward()
    precond.step()
    before = [_present(t).clone() for t in (precond.layers[1].a, precond.layers[1].g)]
    model.zero_grad()
    body(x).sum().backward()  # the head does not run
    precond.step()
    assert torch.equal(_present(precond.layers[1].a), before[0])
    assert torch.equal(_present(precond.layers[1].g), before[1])
    precond.shutdown()


def test_autocast_checkpointing_and_grad_scaler() -> None:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(8, 4)
    plain = KFACPreconditioner(model, kl_clip=None, local_threshold=0)
    model(x).square().mean().backward()
    plain.step()
    reference = (_present(plain.layers[1].a).clone(), _present(plain.layers[1].g).clone(),
                 _present(_linear(model, 2).weight.grad).clone())
    plain.shutdown()

    model.zero_grad()
    again = KFACPreconditioner(model, kl_clip=None, local_threshold=0, grad_scaler=lambda: 512.0)
    out = checkpoint(model, x, use_reentrant=False)  # recomputes every forward in backward
    (out.square().mean() * 512).backward()
    again.step()
    assert torch.allclose(_present(again.layers[1].a), reference[0])
    assert torch.allclose(_present(again.layers[1].g), reference[1])
    assert torch.allclose(_present(_linear(model, 2).weight.grad), reference[2] * 512, rtol=1e-4)
    again.shutdown()

    model.zero_grad()
    mixed = KFACPreconditioner(model, local_threshold=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    mixed.step()
    assert _present(mixed.layers[0].a).dtype == torch.float32
    assert torch.isfinite(_present(_linear(model, 0).weight.grad)).all()
    mixed.shutdown()


def test_interval_callables_are_checked_when_called() -> None:
    precond = KFACPreconditioner(_model(), factor_update_steps=lambda step: 0)
    with pytest.raises(ValueError, match="factor_update_steps gave 0 at step 0"):
        precond.step()
    precond.shutdown()
    with pytest.raises(ValueError, match="inv_update_steps must be an integer"):
        KFACPreconditioner(_model(), inv_update_steps=2.5)  # type: ignore[arg-type]  # on purpose


def test_upper_triangle_round_trip() -> None:
    m = torch.randn(5, 5, dtype=torch.float64)
    m = m + m.t()
    packed = fx.pack_upper(m)
    assert packed.numel() == fx.upper_numel(5) == 15
    assert torch.equal(fx.unpack_upper(packed, 5), m)


def test_empty_batch_computes_no_factor() -> None:
    layer = nn.Linear(3, 2)
    assert fx.a_factor(layer, torch.zeros(0, 3)) is None
    assert fx.g_factor(layer, torch.zeros(0, 2)) is None
