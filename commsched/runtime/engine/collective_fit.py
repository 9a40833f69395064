"""A collective's cost, t = alpha + beta * bytes, fitted from the engine's per-block service
times (Notes [Fitting a collective's cost], [A collective's cost is its typical iteration's])."""

from __future__ import annotations

import statistics

from ...plan import NetModel

DEFAULT_NET = NetModel()


def fit_alpha_beta(samples: list[tuple[int, float]], fallback: NetModel = DEFAULT_NET) -> NetModel:
    """Least-squares fit of t = alpha + beta * bytes over (bytes, seconds) samples.

    Falls back to a proportional fit (alpha from the fallback) when the sizes do not spread, and
    clamps both terms at zero: a negative start-up or per-byte cost is measurement noise.
    """
    if not samples:
        return fallback
    xs = [float(n) for n, _ in samples]
    ys = [float(t) for _, t in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    if var_x <= 0 or len(set(xs)) < 2:
        alpha = min(fallback.alpha, min(ys))
        beta = max((mean_y - alpha) / mean_x, 0.0) if mean_x > 0 else fallback.beta
        return NetModel(alpha, beta)
    beta = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x
    beta = max(beta, 0.0)
    alpha = max(mean_y - beta * mean_x, 0.0)
    return NetModel(alpha, beta)


# Note [Fitting a collective's cost]
# A block's service time (csrc/engine_readout.cpp) is its completion minus the later of its
# launch and the previous block's completion. Over an iteration these add up to the time the
# channel was busy, but one by one they mislead a least-squares line:
# * blocks in flight together (credit) split their shared time unevenly: the first to finish
#   takes the whole overlap, the next one only its tail (3 ranks at 1 Gbit/s: 8 MiB blocks
#   in flight together took a median well under what one takes alone);
# * a small block's time includes the wait for the slowest rank to arrive, which inflates the
#   start-up cost, and after an idle gap a token-bucket-shaped link sends the first bytes at
#   memory speed (Note [The bucket's free burst] in scripts/netem.sh);
# so the line came out too flat for bulk transfers: most predictions of the simulator
# validation were short (figures: benchmarks/notes/README.md, 'Fitting a collective's cost').
# `fit_collective` keeps what stays right:
# the start-up cost is at most the lower quartile of the smaller half of the blocks (a quick
# small block: no late peer, no block ahead of it) and at most least squares' own, and the
# per-byte cost is what makes the samples' total come out as measured, so a plan's predicted
# busy time is its measured one. On clean affine samples this is least squares exactly. The
# samples are those of the latest half of the recorded iterations, as for ready times: the
# first ones are warm-up, and `auto`'s profiling steps ran another plan (all of them once the
# plan has settled: Note [Sampling the profile] in planning/lifecycle.py).
#
# Note [A collective's cost is its typical iteration's]
# The simulator plays one typical iteration and the reports set it beside the median measured
# one, so each block of the plan is charged its median service time over the recorded
# iterations (`typical_blocks`), not every sample: a block's service time holds its wait for
# the latest rank to launch it (the collective starts only then), and now and then that wait
# is far longer than the transfer. On a plan of a few large blocks this hardly matters; on one
# of many small blocks it decides the fit. The CNN's PowerSGD rank-4 plans send 127 KB per
# iteration, a millisecond's worth at 1 Gbit/s; under `mgwfbp` one 40-byte block took far
# longer than that in one iteration and much less in the others, and the fit over every sample
# charged each byte dozens of times the link's cost. Re-simulated from the profiles kept by six
# runs (2 ranks, CNN and Transformer, 1 Gbit/s, plus the CNN on 3 ranks), the compressed
# predictions' median and worst error came down clearly, while the uncompressed ones kept their
# median error and their worst grew a little (figures: benchmarks/notes/README.md, 'A
# collective's cost is its typical iteration's). Medians are taken per position in the plan,
# over the iterations that ran the same blocks (same sizes in the same order: the same plan);
# the blocks of another plan in the window (auto's profiling steps, a re-plan) follow with their
# own medians.


def fit_collective(samples: list[tuple[int, float]], fallback: NetModel = DEFAULT_NET) -> NetModel:
    """t = alpha + beta * bytes for one collective, from its blocks' service times (Note
    [Fitting a collective's cost]); one size only, or no samples: as `fit_alpha_beta`."""
    if len({n for n, _ in samples}) < 2:
        return fit_alpha_beta(samples, fallback)
    total_bytes = sum(n for n, _ in samples)
    total_s = sum(t for _, t in samples)
    by_size = sorted(samples)
    smaller_half = sorted(t for _, t in by_size[: max(1, len(by_size) // 2)])
    alpha = min(fit_alpha_beta(samples, fallback).alpha,
                smaller_half[len(smaller_half) // 4], total_s / len(samples))
    return NetModel(alpha, max(total_s - alpha * len(samples), 0.0) / total_bytes)


def typical_blocks(rounds: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Per iteration's blocks (bytes, seconds), each block's median over the iterations that
    ran the same blocks (Note [A collective's cost is its typical iteration's]); iterations of
    other plans give their own medians, in order of first appearance."""
    by_plan: dict[tuple[int, ...], list[list[float]]] = {}
    for blocks in rounds:
        by_plan.setdefault(tuple(n for n, _ in blocks), []).append([t for _, t in blocks])
    return [(n, statistics.median(times[i] for times in runs))
            for sizes, runs in by_plan.items() for i, n in enumerate(sizes)]
