"""The math of the lossy compressors, as pure functions of tensors (the tests compare them with
float64 references): PowerSGD's factors (``powersgd_*``), top-k's selection (``topk_*``), Deep
Gradient Compression's momentum correction (``dgc_*``), and the single-process simulations
(``simulate_*``) that the tests compare the distributed runs with. Their configurations and
Horovod's casts are in compression.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """(n, m): a tensor of `shape` viewed as a matrix, first dimension by the rest."""
    return int(shape[0]), math.prod(shape[1:])


def initial_q(m: int, rank: int, seed: int, dtype: torch.dtype,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """The first Q: the same on every rank (a generator seeded by the tensor's index)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(m, rank, generator=generator, dtype=torch.float64).to(dtype=dtype,
                                                                          device=device)


def orthogonalise_(p: torch.Tensor) -> torch.Tensor:
    """Replaces the columns of `p`, in place, by an orthonormal basis of a space containing them.

    The basis is the Q factor of Householder QR (LAPACK's, or the device library's).

    Note [Dependent columns of P]
    A gradient's rank can be below the factors' (a linear layer's gradient has at most the
    batch's rank), so some columns of P = M Q lie in the span of the others, or are zero.
    Householder QR still returns orthonormal columns there: the extra ones are directions
    orthogonal to the rest, along which M has (to rounding) nothing, so P P^T M stays a
    projection of M and a factor rank >= rank(M) reproduces M. (Gram-Schmidt, which we used
    before, normalises such a column's rounding noise into a direction that is not orthogonal
    to the others; it had to detect and zero those columns, and a threshold that catches the
    noise also drops small genuine directions that QR keeps.) A column of Q that comes out
    zero, M having nothing along it, keeps its old warm start (warm_start_). A non-finite P (an
    overflowing step under AMP) comes out NaN, whatever the library does with it, so that the
    rebuilt gradient shows the overflow. Deterministic: every rank gets the same bits from the
    same all-reduced P.

    Note [Why QR, not Gram-Schmidt]
    Gram-Schmidt in torch ops costs about 20 small ops per column and, for the dropped-column
    test, a host round trip per column (a device synchronisation on a GPU): for the 18
    compressed matrices (rank 4) of the built-in Transformer on one CPU core, several times what
    one QR each costs, as scripts/powersgd_cost.py measures (figures:
    benchmarks/notes/README.md, 'Why QR, not Gram-Schmidt'). DDP's PowerSGD hook also takes QR
    above rank 2. Half precision has no QR kernel: its P (n x r, small) goes through float32.
    """
    work = p if p.dtype in (torch.float32, torch.float64) else p.float()
    basis, _ = torch.linalg.qr(work)
    # + 0 x each column's norm: nothing, or NaN where the column was not finite.
    p.copy_(basis.add_(torch.linalg.vector_norm(work, dim=-2).mul_(0.0)))
    return p


def powersgd_p(m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """PowerSGD's first factor, P = M Q (n x r), before its all-reduce."""
    return m @ q


def powersgd_q(m: torch.Tensor, p_hat: torch.Tensor) -> torch.Tensor:
    """PowerSGD's second factor, Q = M^T P (m x r), from the orthogonalised, averaged P."""
    return m.T @ p_hat


def powersgd_approx(p_hat: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The rebuilt gradient P Q^T (n x m) from the averaged factors."""
    return p_hat @ q.T


def warm_start_(q: torch.Tensor, new_q: torch.Tensor) -> torch.Tensor:
    """Writes the next step's Q into `q`: this step's, column by column where it is usable.

    A column that came out zero (M has nothing along that column of P, Note [Dependent columns
    of P]) would stay zero; the old one is kept. So is it where the new column is not finite (an
    overflowing step under AMP's loss scaler, which skips that step): one bad step must not
    poison every later one.
    """
    size = new_q.abs().sum(dim=0)  # 0: zero column; inf or NaN: not finite
    return q.copy_(torch.where((size > 0) & (size < float("inf")), new_q, q))


def topk_select(m: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int32 indices ascending) of the k entries of flat `m` largest in magnitude."""
    flat = m.reshape(-1)
    magnitude = flat.abs()
    indices = _topk_among_candidates(magnitude, k) if flat.device.type == "cpu" else None
    if indices is None:
        indices = torch.topk(magnitude, k, sorted=False).indices
    indices = indices.sort().values
    return flat[indices], indices.to(torch.int32)


# Note [Top-k from a sampled threshold]
# torch.topk over a whole gradient costs on one CPU core, for the built-in Transformer's and CNN's
# compressed tensors at 1%, more than every other step of the compressor together (figures:
# benchmarks/notes/README.md, 'Top-k from a sampled threshold'). The k largest are found instead
# among the entries at or above a threshold: the value that 2k/n of an evenly strided sample
# reaches, so that about 2k entries pass. When at least k pass, the k largest of all are among them
# (the k-th largest is then at or above the threshold) and torch.topk over the candidates gives them
# exactly; when fewer pass (a sample that missed where the large entries are), or the sample holds
# NaN or inf (an overflowing step, which no threshold would cut), the whole tensor is searched as
# before. The same entries either way, up to which of equal magnitudes fill the last places
# (torch.topk leaves that open too). NaN passes every threshold, as torch.topk ranks it largest. CPU
# only: on a device, the candidates' count would cost a synchronisation with the host, and the
# device's topk is fast.
_SAMPLE_STRIDE = 97  # prime: a sample that steps across rows of any common width
_SAMPLED_FROM = 1 << 16  # below this, one torch.topk is cheap


def _topk_among_candidates(magnitude: torch.Tensor, k: int) -> torch.Tensor | None:
    n = magnitude.numel()
    if n < _SAMPLED_FROM or 4 * k > n:
        return None
    sample = magnitude[::_SAMPLE_STRIDE]
    wanted = min(sample.numel(), math.ceil(2 * k * sample.numel() / n))
    threshold = float(torch.topk(sample, wanted, sorted=False).values.min())
    if not math.isfinite(threshold):  # NaN or inf sampled (an overflowing step): no cut
        return None
    # not below the threshold (NaN included); above it when it is 0, which most entries of a
    # gradient with untouched rows (an embedding's) reach
    passing = magnitude <= threshold if threshold == 0.0 else magnitude < threshold
    candidates = passing.logical_not_().nonzero().squeeze(1)
    if candidates.numel() < k:
        return None
    return candidates[torch.topk(magnitude[candidates], k, sorted=False).indices]


def topk_combine(numel: int, values: torch.Tensor, indices: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> torch.Tensor:
    """Every rank's (values, indices), concatenated in rank order, summed into a dense tensor."""
    out = torch.zeros(numel, dtype=dtype, device=values.device)
    out.index_add_(0, indices.long(), values)
    return out.mul_(scale)


# -- single-process simulations of one compressed averaging step ---------------------------------

def simulate_powersgd(grads: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                      q: torch.Tensor, scale: float | None = None
                      ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One PowerSGD step over every rank's matrix gradient, in one process, for the tests.

    `scale` multiplies each sum (default: 1 / world, Average; 1 for Sum). Sums in rank order,
    as the engine's collectives may not: compare to tolerance.

    Returns:
        (the approximation of the reduced gradient, new residuals, the next warm-start Q).
    """
    scale = 1.0 / len(grads) if scale is None else scale
    ms = [g + e for g, e in zip(grads, residuals, strict=True)]
    p = orthogonalise_(sum((powersgd_p(m, q) for m in ms), torch.zeros_like(ms[0] @ q)) * scale)
    new_q = sum((powersgd_q(m, p) for m in ms), torch.zeros_like(q)) * scale
    approx = powersgd_approx(p, new_q)
    return approx, [m - approx for m in ms], warm_start_(q.clone(), new_q)


def simulate_topk(grads: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor], k: int,
                  scale: float | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One top-k step over every rank's gradient, in one process, for the tests.

    `scale` as for simulate_powersgd.

    Returns:
        (the reduced gradient, new residuals).
    """
    scale = 1.0 / len(grads) if scale is None else scale
    ms = [g + e for g, e in zip(grads, residuals, strict=True)]
    picked = [topk_select(m, k) for m in ms]
    values = torch.cat([v for v, _ in picked])
    indices = torch.cat([i for _, i in picked])
    average = topk_combine(ms[0].numel(), values, indices, scale, ms[0].dtype)
    new_residuals = []
    for m, (_, index) in zip(ms, picked, strict=True):
        residual = m.clone().reshape(-1)
        residual[index.long()] = 0
        new_residuals.append(residual.reshape(m.shape))
    return average.reshape(ms[0].shape), new_residuals


# -- momentum correction (Deep Gradient Compression) ---------------------------------------------

def dgc_accumulate_(velocity: torch.Tensor, accumulator: torch.Tensor, grad: torch.Tensor,
                    momentum: float, nesterov: bool = False) -> torch.Tensor:
    """DGC's momentum correction of one rank's gradient, in place: the velocity and its sum.

    Lin et al., Deep Gradient Compression (ICLR 2018), with SGD's momentum rule: u = m u + g
    and v = v + u (Nesterov: u = m (u + g) and v = v + u + g, the velocity torch's SGD would
    apply). Top-k then picks from `accumulator` (v) instead of from g plus a residual.

    Args:
        velocity: u, this rank's local momentum (updated).
        accumulator: v, what this rank has yet to send (updated).
        grad: this rank's gradient g (weight decay already added where it applies).
        momentum: SGD's momentum factor m.
        nesterov: Nesterov's variant, as torch's SGD(nesterov=True).

    Returns:
        `accumulator`.
    """
    if nesterov:
        velocity.add_(grad).mul_(momentum)
        return accumulator.add_(velocity).add_(grad)
    velocity.mul_(momentum).add_(grad)
    return accumulator.add_(velocity)


def dgc_mask_(velocity: torch.Tensor, accumulator: torch.Tensor, indices: torch.Tensor) -> None:
    """Momentum-factor masking: where entries were sent, both v and u start again from zero."""
    flat = indices.long()
    accumulator.view(-1)[flat] = 0
    velocity.view(-1)[flat] = 0


def sgd_momentum_factor(momentum: float, dampening: float, nesterov: bool,
                        first_step: bool) -> float:
    """By how much torch's SGD scales a gradient into its update from a zero momentum buffer.

    `first_step`: the buffer is absent, and SGD fills it with the gradient itself, undamped.
    Without Nesterov the update is the buffer, (1 - dampening) g (g on the first step); with
    it, g + m x buffer. Dividing the gradient by this factor makes the update exactly what was
    handed over (Note [DGC under the user's momentum] in
    commsched/runtime/compression/dgc_momentum.py).
    """
    kept = 1.0 if first_step else 1.0 - dampening
    return 1.0 + momentum * kept if nesterov else kept


def simulate_dgc(grads: Sequence[torch.Tensor], velocities: Sequence[torch.Tensor],
                 accumulators: Sequence[torch.Tensor], k: int, momentum: float,
                 nesterov: bool = False, scale: float | None = None
                 ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """One top-k step with DGC's momentum correction over every rank, in one process.

    `scale` as for simulate_powersgd. The reduced tensor is the update itself: a plain SGD
    step (no momentum of its own) subtracts lr times it.

    Returns:
        (the reduced update, new velocities, new accumulators).
    """
    scale = 1.0 / len(grads) if scale is None else scale
    us = [u.clone() for u in velocities]
    vs = [v.clone() for v in accumulators]
    picked = []
    for g, u, v in zip(grads, us, vs, strict=True):
        dgc_accumulate_(u, v, g, momentum, nesterov)
        picked.append(topk_select(v, k))
        dgc_mask_(u, v, picked[-1][1])
    values = torch.cat([value for value, _ in picked])
    indices = torch.cat([index for _, index in picked])
    reduced = topk_combine(vs[0].numel(), values, indices, scale, vs[0].dtype)
    return reduced.reshape(vs[0].shape), us, vs
