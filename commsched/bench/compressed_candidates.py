"""Compression candidates for ``commsched.bench.compare`` (issue 15, item 6), and the bytes each
candidate sends per iteration.

Candidates (beside compare's own):
    hvd-fp16                     hvd.DistributedOptimizer with hvd.Compression.fp16
    torch-ddp-powersgd?rank=4    DDP with its PowerSGD communication hook (PowerSGDState:
                                 rank, start_iter = start_powerSGD_iter, min_rate =
                                 min_compression_rate; error feedback and warm start on, as
                                 commsched's PowerSGD always has them)
    commsched:horovod?compression=powersgd&powersgd_rank=4   (or compression=topk&topk_ratio=...)

DDP refuses start_powerSGD_iter <= 1 with error feedback (its first iterations rebuild buckets),
so its default here is 2; commsched's PowerSGD starts at its start_step (0 by default). The
benchmark times steps after a warm-up longer than both, so both compress in every timed step.
Both compress a tensor viewed as n x m (first dimension by the rest) at rank min(n, m, rank) when
r (n + m) x the rate is below n m (DDP: strictly below; commsched: at most equal), so the same
tensors are compressed at the same rank.

Bytes per iteration, per rank: `payload` is what one rank hands to its collectives (an
all-reduce: its buffer; an all-gather: its own share of the gathered buffer), `sent` what it
sends on a ring (all-reduce 2 (p-1)/p of the buffer, all-gather (p-1)/p of the gathered one:
commsched.sim.network.ring_wire_bytes, as the simulator counts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..compression import LossyCompression, PowerSGD, TopK, from_config
from ..config import load_config
from ..plan import Collective, Plan
from ..sim.network import ring_wire_bytes
from ..sim.profile import ELEMENT_SIZES
from ..world.errors import import_horovod

HVD_FP16 = "hvd-fp16"
DDP_POWERSGD = "torch-ddp-powersgd"
COMPRESSION_KNOBS = ("compression", "powersgd_rank", "powersgd_start_step", "powersgd_min_ratio",
                     "topk_ratio", "topk_start_step", "topk_warmup_steps")


@dataclass(frozen=True)
class WireBytes:
    payload: float
    sent: float

    def as_json(self) -> dict[str, float]:
        return {"payload_bytes": self.payload, "sent_bytes": self.sent}


@dataclass(frozen=True)
class DdpPowerSGD:
    """The PowerSGD hook's settings, by commsched's names for them."""

    rank: int = 4
    start_iter: int = 2
    min_rate: float = 2.0


_DDP_KEYS = {"rank": int, "start_iter": int, "min_rate": float}


def parse_ddp_powersgd(label: str) -> DdpPowerSGD | None:
    """'torch-ddp-powersgd?rank=4&start_iter=2&min_rate=2' -> its settings; None for another
    label. An unknown key or a bad value is one ValueError naming it."""
    name, _, query = label.partition("?")
    if name != DDP_POWERSGD:
        return None
    values: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, _, text = item.partition("=")
        if key not in _DDP_KEYS:
            raise ValueError(f"candidate {label!r}: unknown setting {key!r} (expected "
                             + ", ".join(_DDP_KEYS) + ")")
        try:
            values[key] = _DDP_KEYS[key](text)
        except ValueError:
            raise ValueError(f"candidate {label!r}: {key}={text!r} is not a number") from None
    spec = DdpPowerSGD(**values)
    if spec.rank < 1 or spec.start_iter < 2 or not spec.min_rate > 0:
        raise ValueError(f"candidate {label!r}: expected rank >= 1, start_iter >= 2 (DDP's "
                         "PowerSGD with error feedback starts at 2 at the earliest), min_rate > 0")
    return spec


# Note [DDP's PowerSGD hook on Gloo]
# The hook chains its collectives through futures: the Qs' all-reduce is launched from the
# callback of the Ps' one. On Gloo the callback runs on a worker thread when the Ps arrive, so
# with several buckets the ranks can launch one bucket's Q and another bucket's P in different
# orders: a collective mismatch (Gloo: "Received data size doesn't match expected size"; PyTorch
# skips its own PowerSGD parity test on Gloo, pytorch/pytorch#58467). One bucket per iteration
# keeps the order identical on every rank; the hook then starts communicating when backward has
# ended, which is how the hook runs here (documented in the report). NCCL keeps DDP's buckets.
GLOO_ONE_BUCKET_MB = 1 << 14


def ddp_powersgd_kwargs(spec: DdpPowerSGD | None) -> dict[str, Any]:
    """DDP's extra arguments for the PowerSGD candidate (Note [DDP's PowerSGD hook on Gloo])."""
    import torch.distributed as dist

    if spec is None or dist.get_backend() != "gloo":
        return {}
    return {"bucket_cap_mb": GLOO_ONE_BUCKET_MB}


def register_ddp_powersgd(model: nn.parallel.DistributedDataParallel, spec: DdpPowerSGD) -> Any:
    """Installs DDP's PowerSGD hook on `model`; returns its state (kept alive with the model)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=spec.rank,
        start_powerSGD_iter=spec.start_iter, min_compression_rate=spec.min_rate,
        use_error_feedback=True, warm_start=True, random_seed=0)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


def split_compression(knobs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the compressor for DistributedOptimizer's `compression=`, the other knobs).

    `compression` is DistributedOptimizer's own argument and takes an object, so a candidate's
    compression knobs (`compression=powersgd&powersgd_rank=4`) are turned into one, validated
    as the knobs are (COMMSCHED_COMPRESSION and its parameters' rules); None without them."""
    chosen = {k: v for k, v in knobs.items() if k in COMPRESSION_KNOBS}
    rest = {k: v for k, v in knobs.items() if k not in COMPRESSION_KNOBS}
    if not chosen:
        return None, rest
    return from_config(load_config(chosen, environ={})), rest


def lossy_of(knobs: dict[str, Any]) -> LossyCompression | None:
    """The lossy compressor a commsched candidate's knobs name (None: none, or a cast)."""
    compression, _ = split_compression(knobs)
    return compression if isinstance(compression, (PowerSGD, TopK)) else None


# -- bytes per iteration -------------------------------------------------------------------------

def gradient_shapes(model: nn.Module) -> list[tuple[tuple[int, ...], int]]:
    """(shape, element size) of every gradient the model produces."""
    return [(tuple(p.shape), p.element_size()) for p in model.parameters() if p.requires_grad]


def _allreduced(nbytes: float, world: int) -> WireBytes:
    return WireBytes(nbytes, ring_wire_bytes(Collective.ALLREDUCE, nbytes, world))


def hvd_bytes(shapes: Iterable[tuple[tuple[int, ...], int]], world: int,
              fp16: bool = False) -> WireBytes:
    """Horovod all-reduces every gradient (floating ones as 2-byte values with fp16)."""
    total = sum(math.prod(shape) * (2 if fp16 else size) for shape, size in shapes)
    return _allreduced(total, world)


def ddp_powersgd_bytes(shapes: Iterable[tuple[tuple[int, ...], int]], world: int,
                       spec: DdpPowerSGD) -> WireBytes:
    """The hook's all-reduces once it compresses: the uncompressed tensors, every P (n x r),
    every Q (m x r), with r = min(n, m, rank), for tensors where r (n + m) x min_rate < n m."""
    total = 0
    for shape, size in shapes:
        n = shape[0] if shape else 1
        m = math.prod(shape[1:])
        r = min(n, m, spec.rank)
        if r * (n + m) * spec.min_rate < n * m:
            total += (n + m) * r * size
        else:
            total += n * m * size
    return _allreduced(total, world)


def plan_bytes(plan: Plan, world: int) -> WireBytes:
    """A commsched plan's blocks (with a lossy compressor: its wire tensors instead of the
    gradients it compresses). An all-gather block holds every rank's share."""
    payload = sent = 0.0
    for block in plan.blocks:
        nbytes = sum(p.numel for p in block.pieces) * ELEMENT_SIZES[block.dtype]
        sent += ring_wire_bytes(block.op, nbytes, world)
        payload += nbytes / world if block.op is Collective.ALL_GATHER else nbytes
    return WireBytes(payload, sent)


def candidate_bytes(label: str, model: nn.Module, optimizer: Any, world: int) -> WireBytes | None:
    """Bytes per iteration of one compare candidate; None where it sends nothing (local)."""
    shapes = gradient_shapes(model.module if isinstance(
        model, nn.parallel.DistributedDataParallel) else model)
    ddp = parse_ddp_powersgd(label)
    if ddp is not None:
        return ddp_powersgd_bytes(shapes, world, ddp)
    if label in ("hvd", "torch-ddp", HVD_FP16):
        return hvd_bytes(shapes, world, fp16=label == HVD_FP16)
    plan = getattr(optimizer, "plan", None)
    return plan_bytes(plan, world) if isinstance(plan, Plan) else None


def fp16_compression() -> Any:
    """Horovod's fp16 compression, for the `hvd-fp16` candidate."""
    hvd = import_horovod(f"the benchmark candidate {HVD_FP16!r} uses Horovod's fp16 compression,")
    return hvd.Compression.fp16
