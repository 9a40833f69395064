"""What PowerSGD's own compute costs per iteration on one CPU core, over a built-in model's
compressed tensors (rank 4, the default min_ratio). Two tables:

- orthogonalisation: the Q factor of QR (commsched.compression_math.orthogonalise_) against
  Gram-Schmidt twice in torch ops (what commsched used before; kept here only as the
  comparison);
- the two products P = M Q and Q = M^T P with Q stored m x r row-major (DDP's PowerSGD hook's
  layout, and commsched's before) against Q stored as r x m rows (Note [Q is kept transposed]
  in commsched/runtime/compression/gradients.py).

Interleaved rounds, median per iteration. Not a benchmark of training:
benchmarks/compression_speed is that.

    .venv/bin/python scripts/powersgd_cost.py [--models cnn transformer] [--rank 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from commsched.bench.models import ModelName, build
from commsched.compression import PowerSGD
from commsched.compression_math import matrix_shape, orthogonalise_

ROUNDS, CALLS = 9, 10


def gram_schmidt_(p: torch.Tensor) -> torch.Tensor:
    """Columns in order, each projection done twice, a column that kept under sqrt(eps) of
    its norm zeroed (one host round trip per column for that test)."""
    tolerance = torch.finfo(p.dtype).eps ** 0.5
    for i in range(p.shape[1]):
        column = p[:, i]
        before = column.norm()
        for _ in range(2 if i else 0):
            column -= p[:, :i] @ (p[:, :i].T @ column)
        after = column.norm()
        if after <= tolerance * before or after == 0:
            column.zero_()
        else:
            column /= after
    return p


def factors(model_name: ModelName, rank: int) -> list[torch.Tensor]:
    lossy = PowerSGD(rank=rank)
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(matrix_shape(p.shape)[0], lossy.rank_for(p.shape), generator=gen)
            for p in build(model_name).parameters() if lossy.compresses(p.shape)]


def products_ms(ms: list[torch.Tensor], rank: int, transposed: bool) -> float:
    """P = M Q, then Q = M^T P, for every matrix, into preallocated outputs."""
    ps = [torch.empty(m.shape[0], rank) for m in ms]
    if transposed:  # Q^T rows: P = M (Q^T)^T, Q^T = P^T M
        qts = [torch.randn(rank, m.shape[1]) for m in ms]
        started = time.perf_counter()
        for _ in range(CALLS):
            for m, p, qt in zip(ms, ps, qts, strict=True):
                torch.matmul(m, qt.T, out=p)
                torch.matmul(p.T, m, out=qt)
    else:
        qs = [torch.randn(m.shape[1], rank) for m in ms]
        started = time.perf_counter()
        for _ in range(CALLS):
            for m, p, q in zip(ms, ps, qs, strict=True):
                torch.matmul(m, q, out=p)
                torch.matmul(m.T, p, out=q)
    return (time.perf_counter() - started) / CALLS * 1e3


def per_iteration_ms(method: Callable[[torch.Tensor], torch.Tensor],
                     ps: list[torch.Tensor]) -> float:
    copies = [[p.clone() for p in ps] for _ in range(CALLS)]
    started = time.perf_counter()
    for batch in copies:
        for p in batch:
            method(p)
    return (time.perf_counter() - started) / CALLS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--rank", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | compressed tensors | Gram-Schmidt ms/iter | QR ms/iter | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in args.models:
        ps = factors(ModelName(name), args.rank)
        times: dict[str, list[float]] = {"gs": [], "qr": []}
        for _ in range(ROUNDS):
            times["gs"].append(per_iteration_ms(gram_schmidt_, ps))
            times["qr"].append(per_iteration_ms(orthogonalise_, ps))
        gs, qr = statistics.median(times["gs"]), statistics.median(times["qr"])
        print(f"| {name} | {len(ps)} | {gs:.2f} | {qr:.2f} | {qr / gs:.3f} |")
    print("\n| model | P = M Q and Q = M^T P, Q row-major ms/iter | Q stored transposed ms/iter "
          "| ratio |")
    print("|---|---:|---:|---:|")
    for name in args.models:
        gen = torch.Generator().manual_seed(0)
        ms = [torch.randn(matrix_shape(p.shape), generator=gen)
              for p in build(ModelName(name)).parameters()
              if PowerSGD(rank=args.rank).compresses(p.shape)]
        layouts: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for transposed in (False, True):
                layouts[transposed].append(products_ms(ms, args.rank, transposed))
        row_major, transposed_ms = (statistics.median(layouts[k]) for k in (False, True))
        print(f"| {name} | {row_major:.2f} | {transposed_ms:.2f} | "
              f"{transposed_ms / row_major:.3f} |")


if __name__ == "__main__":
    main()
