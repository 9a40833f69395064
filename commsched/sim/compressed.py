"""The simulator's named compressors: a profile's gradients replaced by the wire tensors the run
would send (commsched.plan.compressed builds both layouts), and the compute they add.

Note [Simulated compression compute]
The run spends `compute.compression_s` per iteration on the training thread outside the gradient
hooks (the profiler records it for a compressed run): in synchronize(), orthogonalisation,
Q = M^T P and the decompression (top-k: the decompression). What the hooks do (P = M Q, the
top-k selection) lengthens backward, and the profile's ready times, which include every
compressed gradient's hand-over, already show it. The simulator puts compression_s in one span
after backward: for PowerSGD it starts when backward has ended and every P block is done (the
training thread waits for the Ps before it computes the Qs), and the Q blocks are offered when it
ends; for top-k it starts when backward ends and the all-gather blocks are offered when it ends.
Counting the Qs as waiting for every P rather than their own makes the prediction slightly
pessimistic. Without a measurement (a profile of an uncompressed run, whose backward has no
hooks' share either), an estimate of all of the compressor's compute is used (ESTIMATED_FLOP_S,
TOPK_S_PER_ELEMENT) and a note says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..compression import Compression, LossyCompression, PowerSGD
from ..compression_math import matrix_shape
from ..config import ConfigError
from ..plan import Plan, TensorSpec
from ..plan.compressed import (
    Factored,
    PlanBuilder,
    Sparsified,
    WireLayout,
    compressed_plan,
    powersgd_wire,
    topk_wire,
)
from .profile import RunProfile, TensorRecord, ready_profile, specs_from_profile
from .timing import CompressorCompute

# Stated estimates for a profile without compute.compression_s (a run without a compressor):
# PowerSGD's matrix products at 10 GFLOP/s, top-k's selection and update at 4 ns per element.
ESTIMATED_FLOP_S = 1e10
TOPK_S_PER_ELEMENT = 4e-9
_FLOATS = ("float64", "double", "float32", "float", "float16", "half", "bfloat16")


class CompressorError(ValueError):
    """A compressor named on the command line is not one we have, or has bad parameters."""


def parse_compressor(text: str) -> LossyCompression:
    """`powersgd:RANK` or `topk:RATIO` (e.g. powersgd:4, topk:0.01), validated like the
    factories' arguments."""
    match = re.fullmatch(r"\s*(powersgd|topk):([^:]+)", text.lower())
    if not match:
        raise CompressorError(f"--compression {text!r}: expected a ratio (e.g. 2) or a "
                              "compressor: powersgd:RANK (e.g. powersgd:4) or topk:RATIO "
                              "(e.g. topk:0.01)")
    name, value = match.groups()
    try:
        if name == "powersgd":
            if not value.strip().isdigit():
                raise ConfigError(f"rank {value!r}: expected a whole number >= 1")
            return Compression.powersgd(rank=int(value))
        return Compression.topk(ratio=float(value))
    except (ConfigError, ValueError) as err:
        raise CompressorError(f"--compression {text!r}: {err}") from None


def matrix_of(t: TensorRecord) -> tuple[tuple[int, ...], bool]:
    """The tensor's shape, and whether it is the profile's; else the squarest n x m with n * m
    = numel (n the largest divisor <= sqrt(numel)), which gives the smallest factors: the
    simulated exchange is then a lower bound."""
    if t.shape is not None:
        return t.shape, True
    n = max((d for d in range(1, math.isqrt(t.numel) + 1) if t.numel % d == 0), default=1)
    return ((n, t.numel // n) if n > 1 else (t.numel,)), False


@dataclass(frozen=True)
class CompressedRun:
    """A profile with the compressor's wire tensors appended, and what the plan needs."""

    run: RunProfile
    layout: WireLayout
    compression_s: float
    notes: tuple[str, ...]
    gradients: int  # how many of run's tensors are gradients: the wire tensors' rows follow

    def plan(self, build: PlanBuilder) -> Plan:
        """The policy's plan (`build`) over the gradients left and the wire tensors."""
        specs = specs_from_profile(self.run)[:self.first_wire]
        return compressed_plan(build, specs, self.layout, ready_profile(self.run))

    @property
    def compute(self) -> CompressorCompute:
        """What the simulation adds: the compressor's time, the blocks it waits for and the
        blocks that wait for it."""
        return CompressorCompute(self.compression_s, self.waited_for, self.after_compute,
                                 self.layout.carriers)

    @property
    def first_wire(self) -> int:
        return self.gradients

    @property
    def wire_specs(self) -> tuple[TensorSpec, ...]:
        return self.layout.early + self.layout.late + self.layout.gathered

    @property
    def waited_for(self) -> frozenset[int]:
        """Wire tensors whose blocks the compute waits for (PowerSGD's P)."""
        return frozenset(s.tensor_id for s in self.layout.early)

    @property
    def after_compute(self) -> frozenset[int]:
        """Wire tensors whose blocks are launched only after the compute (Q, top-k's)."""
        return frozenset(s.tensor_id for s in self.layout.late + self.layout.gathered)


def compress_run(run: RunProfile, lossy: LossyCompression, world: int) -> CompressedRun:
    """`run` with the wire tensors of `lossy` at world size `world`: the gradients it
    compresses stay in the profile (their ids do not change) but are in no block."""
    notes: list[str] = []
    chosen, guessed = [], 0
    for t in run.tensors:
        shape, known = matrix_of(t)
        if t.dtype in _FLOATS and lossy.compresses(shape):
            chosen.append((t, shape))
            guessed += not known and isinstance(lossy, PowerSGD)
    if guessed:
        notes.append(f"{lossy.label}: {guessed} tensors have no shape in the profile: each is "
                     "taken as its squarest n x m matrix (smallest factors)")
    first = len(run.tensors)
    if isinstance(lossy, PowerSGD):
        layout = powersgd_wire(lossy.label, [
            Factored(t, *matrix_shape(shape), lossy.rank_for(shape)) for t, shape in chosen],
            first)
    else:
        layout = topk_wire(lossy.label, [Sparsified(t, lossy.k(t.numel)) for t, _ in chosen],
                           world, first)
    return attach_wire(run, layout, lossy, [shape for _, shape in chosen], notes)


def attach_wire(run: RunProfile, layout: WireLayout, lossy: LossyCompression,
                shapes: list[tuple[int, ...]], notes: list[str] | None = None,
                registered: Sequence[TensorSpec] = ()) -> CompressedRun:
    """`run` with `layout`'s wire tensors appended (ids from len(run.tensors) on, as the run
    numbers them); `shapes` (of the compressed gradients) give the estimate of the compute
    when the profile has no compute.compression_s. The optimizer's `auto` passes the layout it
    runs, whose shapes are exact, and `registered`: every wire tensor the run numbered, in id
    order, of which those outside `layout` (top-k's other warm-up stages) are rows no plan
    holds."""
    notes = list(notes or [])
    seconds = run.compression_s
    if seconds is None:
        seconds = estimated_seconds(lossy, shapes)
        how = (f"6 n m r flops at {ESTIMATED_FLOP_S:g} flop/s" if isinstance(lossy, PowerSGD)
               else f"{TOPK_S_PER_ELEMENT * 1e9:g} ns per compressed element")
        notes.append(f"{lossy.label}: compute.compression_s missing: estimated "
                     f"{seconds * 1e3:.3f} ms per iteration ({how})")
    wire_rows = _wire_records(run, layout, sorted(layout.compressed), registered)
    extended = replace(run, tensors=run.tensors + wire_rows)
    return CompressedRun(extended, layout, seconds, tuple(notes), len(run.tensors))


def with_shapes(document: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """A copy of a profile document whose tensors carry their shapes (by name), for a profile
    written without them (the profiler does not record shapes)."""
    tensors = [dict(row, shape=list(shapes[row["name"]])) if row.get("name") in shapes
               else row for row in document.get("tensors", [])]
    return {**document, "tensors": tensors}


def estimated_seconds(lossy: LossyCompression, shapes: list[tuple[int, ...]]) -> float:
    if isinstance(lossy, PowerSGD):
        flops = sum(6 * n * m * lossy.rank_for(s) for s in shapes for n, m in [matrix_shape(s)])
        return flops / ESTIMATED_FLOP_S
    return sum(math.prod(s) for s in shapes) * TOPK_S_PER_ELEMENT


def _wire_records(run: RunProfile, layout: WireLayout, compressed: list[int],
                  registered: Sequence[TensorSpec] = ()) -> tuple[TensorRecord, ...]:
    """Ready times of the wire tensors (from the first gradient): a P when its gradient is; a
    Q or a gathered tensor when the last compressed gradient is (their blocks wait for the
    compute anyway, see the Note)."""
    ready = {t.tensor_id: t.ready_time_s for t in run.tensors}
    known = [at for i in compressed if (at := ready[i]) is not None]
    last = max(known) if known else None
    used = {s.tensor_id for s in layout.early + layout.late + layout.gathered}
    rows = []
    for spec in registered or layout.early + layout.late + layout.gathered:
        source = layout.source.get(spec.tensor_id)
        at = ready[source] if source is not None else last
        # Another stage's tensor: in no plan, so no bytes (totals and the update's cost).
        numel = spec.numel if spec.tensor_id in used else 0
        rows.append(TensorRecord(spec.tensor_id, spec.name, numel, spec.dtype,
                                 spec.element_size, spec.forward_index, ready_time_s=at))
    return tuple(rows)
