"""One-process replays of a data-parallel job's committed history, for the checks that a job
which lost workers ended where it should (tests/jobs/elastic_job.py, the chaos run).

Each step of a history names the ranks whose gradients it averaged; their batches follow from
(step, rank). Under a lossy compressor the replay runs every rank's compressor with
compression_math's single-process simulations, each rank's state starting afresh wherever the
job bound to a new world (Note [Elastic Horovod and compressor state] in
commsched/runtime/elastic_guard.py). K-FAC is replayed in a world of one on the step's batches
concatenated, which averages the same gradients and factors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

import commsched
import commsched.compression_math as cm
from commsched.compression import PowerSGD, TopK
from commsched.kfac import KFACPreconditioner

# What a job's "+powersgd" and "+topk" entries compress with.
LOSSY: dict[str, PowerSGD | TopK] = {"powersgd": commsched.Compression.powersgd(rank=1),
                                     "topk": commsched.Compression.topk(ratio=0.1)}

LossOf = Callable[[nn.Module, int, int], torch.Tensor]  # (model, step, rank) -> loss
ROWS = 4  # of each rank's batch


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's own batch of the jobs replayed here (6 features, 2 targets): the average
    gradient of a step depends on which ranks ran it."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(ROWS, 6, generator=gen), torch.randn(ROWS, 2, generator=gen)


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    """The MSE loss of `batch(step, rank)`, in the model's dtype."""
    x, y = batch(step, rank)
    dtype = next(model.parameters()).dtype
    return nn.functional.mse_loss(model(x.to(dtype)), y.to(dtype))


def make_preconditioner(model: nn.Module, lr: float) -> KFACPreconditioner:
    """The jobs' K-FAC: every decomposition placed on a rank and shared (local_threshold=0),
    recomputed every third step, so that a commit restored mid-run holds older ones."""
    return KFACPreconditioner(model, inv_update_steps=3, local_threshold=0, lr=lr)


def replay(model: nn.Module, opt: torch.optim.Optimizer, history: Sequence[tuple[int, list[int]]],
           loss_of: LossOf, lossy: str | None = None, binds: Sequence[int] | None = None,
           dgc: bool = True) -> list[torch.Tensor]:
    """Trains `model` with `opt` through `history` ((step, ranks averaged)) and returns its
    parameters.

    Args:
        model: the job's model, as every rank built it.
        opt: a plain optimizer of `model`'s parameters, as the job's wrapped one.
        history: each committed step with the ranks whose gradients it averaged.
        loss_of: a rank's loss at a step.
        lossy: a key of LOSSY, or None for the plain average.
        binds: per step, how many times the job had bound to a world (where it changes, every
            rank's compressor starts afresh); None: never.
        dgc: top-k under momentum SGD with DGC's correction (the user's SGD), or with plain
            error feedback (an SGD subclass whose step() is its own).

    Returns:
        The parameters after the last step.
    """
    params: list[torch.Tensor] = list(model.parameters())
    momentum = float(opt.param_groups[0].get("momentum", 0.0))
    state: dict = {}
    for index, (step, ranks) in enumerate(history):
        if binds is not None and (index == 0 or binds[index] != binds[index - 1]):
            state = {}
        grads = []
        for r in ranks:
            model.zero_grad()
            loss_of(model, step, r).backward()
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                          for p in params])
        for i, p in enumerate(params):
            p.grad = _exchanged(LOSSY.get(lossy or ""), params, i, [g[i] for g in grads],
                                state, opt, momentum if dgc else None)
        opt.step()
    return [p.detach().clone() for p in params]


def _exchanged(compressor: PowerSGD | TopK | None, params: list[torch.Tensor], i: int,
               grads: list[torch.Tensor], state: dict, opt: torch.optim.Optimizer,
               dgc_momentum: float | None) -> torch.Tensor:
    """Parameter i's averaged gradient as `compressor` makes it from every rank's `grads`;
    `state` holds, per tensor, the ranks' residuals (velocities) and Q."""
    param = params[i]
    if compressor is None or not compressor.compresses(param.shape):
        return sum(grads[1:], grads[0].clone()) * (1.0 / len(grads))
    if isinstance(compressor, PowerSGD):
        n, m = cm.matrix_shape(param.shape)
        seed = sum(compressor.compresses(p.shape) for p in params[:i])  # as the compressor's
        kept = state.setdefault(i, {
            "q": cm.initial_q(m, compressor.rank_for(param.shape), seed, param.dtype),
            "e": [torch.zeros(n, m, dtype=param.dtype) for _ in grads]})
        approx, kept["e"], kept["q"] = cm.simulate_powersgd([g.reshape(n, m) for g in grads],
                                                            kept["e"], kept["q"])
        return approx.reshape(param.shape)
    if not dgc_momentum:
        kept = state.setdefault(i, {"e": [torch.zeros_like(param) for _ in grads]})
        average, kept["e"] = cm.simulate_topk(grads, kept["e"], compressor.k(param.numel()))
        return average
    kept = state.setdefault(i, {"u": [torch.zeros_like(param) for _ in grads],
                                "v": [torch.zeros_like(param) for _ in grads]})
    update, kept["u"], kept["v"] = cm.simulate_dgc(grads, kept["u"], kept["v"],
                                                   compressor.k(param.numel()), dgc_momentum)
    # DGC's update already holds the momentum: the optimizer's own starts from zero each step.
    buffer = opt.state.get(param, {}).get("momentum_buffer")
    if buffer is not None:
        buffer.zero_()
    return update


def replay_kfac(model: nn.Module, opt: torch.optim.Optimizer, precond: KFACPreconditioner,
                history: Sequence[tuple[int, list[int]]],
                batch_of: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
                ) -> list[torch.Tensor]:
    """Trains `model` with `opt` and a K-FAC preconditioner made in a world of one, each step
    on its ranks' batches (`batch_of(step, rank)`) concatenated under an MSE loss: the same
    averaged gradient and factors as the job's ranks (tests/kfac/test_kfac_dist.py). Its state
    is never reset: an elastic job keeps K-FAC's whole (Note [Elastic K-FAC])."""
    dtype = next(model.parameters()).dtype
    for step, ranks in history:
        rows = [batch_of(step, r) for r in ranks]
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.cat([x for x, _ in rows]).to(dtype)),
                               torch.cat([y for _, y in rows]).to(dtype)).backward()
        precond.step()
        opt.step()
    precond.shutdown()
    return [p.detach().clone() for p in model.parameters()]
