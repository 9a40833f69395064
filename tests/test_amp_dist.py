"""Mixed precision on 2 Gloo ranks, against DDP with the same GradScaler in the same job.

Every policy trains 30 steps under fp16 autocast with ``torch.amp.GradScaler``; at step
OVERFLOW rank 1 alone feeds an input that overflows fp16, so the scaler must skip that step on
every rank (DDP averages the inf into every rank's gradients). The scaler grows its scale every
GROWTH steps, so the scale moves both ways. Both recipes run: DDP's plain ``scaler.step(opt)``
and Horovod's (``synchronize()``, ``unscale_``, clipping, ``scaler.step`` inside
``skip_synchronize()``), the latter against DDP's clipping recipe.
bf16 autocast (whose range is float32's: nothing overflows) needs no scaler and runs DDP's
plain loop. One spawned job runs every case; the
tests below read its results.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import distributed_test
from torch import nn

pytestmark = pytest.mark.processes

STEPS = 30
OVERFLOW = 12
GROWTH = 5
CLIP = 0.5  # below this model's gradient norms: clipping changes every step it runs in
POLICIES = ["horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto"]
# (policy, compression): the casts and both lossy compressors, each under a synchronous and an
# overlap policy.
COMPRESSED = [("horovod", "fp16"), ("dear", "bf16"), ("mgwfbp", "powersgd"),
              ("bytescheduler", "powersgd"), ("horovod", "topk"), ("prophet", "topk")]
# Exact for uncompressed averages of 2 ranks (each a single sum, as in DDP's buckets); a cast
# on the wire rounds where DDP's gradients stay float32.
EXACT, CAST = 0.0, 2e-3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(),
                                  nn.Linear(48, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _batch(step: int, rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(16, 12, generator=gen), torch.randn(16, 3, generator=gen)
    if step == OVERFLOW and rank == 1 and dtype is torch.float16:
        x = x * 1e6  # inf once autocast casts it to fp16
    return x, y


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters and momentum buffers: what a skipped step must leave as they were."""
    state = [opt.state[p].get("momentum_buffer") for p in model.parameters()]
    return [p.detach().clone() for p in model.parameters()] + \
        [b.clone() for b in state if b is not None]


def _train(dtype: torch.dtype, wrap: Any, recipe: str) -> dict[str, Any]:
    """Trains a fresh Net; `wrap(model, opt)` returns (module to call, optimizer to step)."""
    import commsched

    rank = commsched.rank()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    net, opt = wrap(model, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=GROWTH,
                                  enabled=dtype is torch.float16)
    scales, skipped_changed = [], None
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, rank, dtype)
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.mse_loss(net(x).float(), y)
        scaler.scale(loss).backward()
        before = _snapshot(model, opt) if step == OVERFLOW else None
        if recipe == "horovod":  # the README's, clipping included
            opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            with opt.skip_synchronize():
                scaler.step(opt)
        elif recipe == "ddp clip":  # DDP's own recipe for clipping
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        if before is not None:
            if hasattr(opt, "flush"):
                opt.flush()  # an overlap plan would apply a step in the next forward pass
            after = _snapshot(model, opt)
            skipped_changed = max(float((a - b).abs().max()) for a, b in zip(before, after,
                                                                              strict=True))
    if hasattr(opt, "flush"):
        opt.flush()
    params = [p.detach().clone() for p in model.parameters()]
    if hasattr(opt, "session"):
        opt.session.close()
    return {"params": params, "scales": scales, "skipped_changed": skipped_changed,
            "finite": all(bool(torch.isfinite(p).all()) for p in params)}


def _ddp(hook: str | None = None) -> Any:
    def wrap(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Any, Any]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        if hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, opt
    return wrap


def _commsched(policy: str, compression: str = "none") -> Any:
    def wrap(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Any, Any]:
        import commsched

        made = {"none": commsched.Compression.none, "fp16": commsched.Compression.fp16,
                "bf16": commsched.Compression.bf16,
                "powersgd": commsched.Compression.powersgd(rank=2),
                "topk": commsched.Compression.topk(ratio=0.25)}[compression]
        return model, commsched.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(), model=model, policy=policy,
            compression=made, profile_steps=2)
    return wrap


def _job() -> dict[str, Any]:
    import commsched

    commsched.init()
    fp16, bf16 = torch.float16, torch.bfloat16
    out: dict[str, Any] = {
        "torch-ddp fp16": _train(fp16, _ddp(), "ddp"),
        "torch-ddp bf16": _train(bf16, _ddp(), "ddp"),
        "torch-ddp fp16 hook": _train(fp16, _ddp("fp16"), "ddp"),
        "torch-ddp fp16 clip": _train(fp16, _ddp(), "ddp clip")}
    for policy in POLICIES:
        for recipe in ("ddp", "horovod"):
            out[f"{policy} fp16 {recipe}"] = _train(fp16, _commsched(policy), recipe)
        out[f"{policy} bf16 ddp"] = _train(bf16, _commsched(policy), "ddp")
    for policy, compression in COMPRESSED:
        out[f"{policy} fp16 ddp {compression}"] = _train(fp16, _commsched(policy, compression),
                                                          "ddp")
    out["unscale before synchronize"] = _unscale_first()
    return out


def _unscale_first() -> str:
    """DDP's clipping recipe (scaler.unscale_ right after backward) would have the scaler read
    and rescale gradients the engine is still averaging: refused, naming the recipes to use."""
    model = Net()
    net, opt = _commsched("horovod")(model, torch.optim.SGD(model.parameters(), lr=0.05))
    scaler = torch.amp.GradScaler("cpu")
    x, y = _batch(0, 0, torch.float16)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(net(x).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    try:
        scaler.step(opt)
    except RuntimeError as err:
        return str(err)
    finally:
        opt.session.close()
    return "no error"


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return distributed_test(_job, world_size=2, timeout=240)


def _diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_ddp_reference_skips_the_overflow_step(results: dict[int, dict[str, Any]]) -> None:
    """The reference itself: the overflow on rank 1 backs the scale off on both ranks, and the
    scale also grew, so the comparisons below see it move both ways."""
    scales = results[0]["torch-ddp fp16"]["scales"]
    assert scales == results[1]["torch-ddp fp16"]["scales"]
    assert scales[OVERFLOW] == scales[OVERFLOW - 1] / 2, scales
    assert max(scales) > scales[0], scales
    assert results[0]["torch-ddp fp16"]["skipped_changed"] == 0.0
    clipped = results[0]["torch-ddp fp16 clip"]
    assert clipped["scales"] == scales
    assert _diff(clipped["params"], results[0]["torch-ddp fp16"]["params"]) > 1e-4


@pytest.mark.parametrize("recipe", ["ddp", "horovod"])
@pytest.mark.parametrize("policy", POLICIES)
def test_fp16_grad_scaler_matches_ddp(results: dict[int, dict[str, Any]], policy: str,
                                      recipe: str) -> None:
    for rank in (0, 1):
        reference = "torch-ddp fp16 clip" if recipe == "horovod" else "torch-ddp fp16"
        ours, ddp = results[rank][f"{policy} fp16 {recipe}"], results[rank][reference]
        assert ours["scales"] == ddp["scales"], (rank, ours["scales"], ddp["scales"])
        assert ours["skipped_changed"] == 0.0, f"rank {rank}: the skipped step changed a value"
        assert _diff(ours["params"], ddp["params"]) <= EXACT, rank


@pytest.mark.parametrize("policy", POLICIES)
def test_bf16_autocast_matches_ddp(results: dict[int, dict[str, Any]], policy: str) -> None:
    for rank in (0, 1):
        ours, ddp = results[rank][f"{policy} bf16 ddp"], results[rank]["torch-ddp bf16"]
        assert _diff(ours["params"], ddp["params"]) <= EXACT, rank


@pytest.mark.parametrize(("policy", "compression"), COMPRESSED)
def test_fp16_grad_scaler_with_compression(results: dict[int, dict[str, Any]], policy: str,
                                           compression: str) -> None:
    """fp16 on the wire matches DDP with fp16_compress_hook (DDP's bf16 hook needs NCCL). The
    others cannot match DDP's parameters, but their scale must (no spurious overflow, the real
    one skipped), the skipped step must change nothing, and error feedback must not keep the
    overflow's inf."""
    for rank in (0, 1):
        ours = results[rank][f"{policy} fp16 ddp {compression}"]
        assert ours["scales"] == results[rank]["torch-ddp fp16"]["scales"], (rank, ours["scales"])
        assert ours["skipped_changed"] == 0.0, f"rank {rank}: the skipped step changed a value"
        assert ours["finite"], f"rank {rank}: non-finite parameters after the overflow"
        if compression == "fp16":
            ddp = results[rank]["torch-ddp fp16 hook"]
            assert _diff(ours["params"], ddp["params"]) <= CAST, rank
    assert _diff(results[0][f"{policy} fp16 ddp {compression}"]["params"],
                 results[1][f"{policy} fp16 ddp {compression}"]["params"]) == 0.0


def test_unscale_before_synchronize_names_the_recipes(results: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        message = results[rank]["unscale before synchronize"]
        assert "before they were averaged" in message, message
        assert "optimizer.synchronize() before scaler.unscale_(optimizer)" in message, message
