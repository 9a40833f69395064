"""Gradient compression: casts on the wire and two lossy compressors with error feedback.

The casts keep Horovod's interface (``Compression.none``, ``fp16``) and add bf16; the lossy
compressors are PowerSGD and top-k (docs/compression.md).

A cast is applied by the engine while it packs the fusion buffer (``wire_dtype``), so its
compressor is a description of the cast; ``compress``/``decompress`` keep Horovod's calling
convention for code that uses them directly.

``Compression.powersgd(...)`` and ``Compression.topk(...)`` return configurations: the run
(commsched.runtime.compression.gradients) turns them into extra wire tensors of the plan. The math
itself
is in compression_math.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .compression_math import matrix_shape
from .config import KNOBS_BY_KEY, Config, parse_value


class Compressor:
    """A cast on the wire, Horovod's compressor interface: ``Compression.none``, ``fp16``, ``bf16``.

    The engine casts floating-point gradients to `wire` while it packs a fusion buffer and back
    when it unpacks, so the user passes the class itself (``compression=Compression.fp16``) and
    never calls it; compress() and decompress() keep Horovod's calling convention for code that
    does.
    """

    wire: torch.dtype | None = None  # None: send as is

    @classmethod
    def wire_dtype(cls, dtype: torch.dtype) -> torch.dtype:
        """The dtype a gradient of `dtype` travels in (integer gradients are never cast)."""
        if cls.wire is None or not dtype.is_floating_point:
            return dtype
        return cls.wire

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Casts `tensor` for the wire, with Horovod's calling convention.

        Args:
            tensor: the gradient to send.

        Returns:
            (the cast tensor, the context decompress() needs: the original dtype).
        """
        return tensor.to(cls.wire_dtype(tensor.dtype)), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Casts a received `tensor` back to its dtype, with Horovod's calling convention.

        Args:
            tensor: what came off the wire.
            ctx: the context compress() returned (the original dtype).

        Returns:
            `tensor` in its original dtype.
        """
        return tensor.to(ctx)


class NoneCompressor(Compressor):
    """No compression: gradients travel in their own dtype (``Compression.none``)."""

    wire = None


class FP16Compressor(Compressor):
    """Floating-point gradients travel as float16 (``Compression.fp16``), half of fp32's bytes."""

    wire = torch.float16


class BF16Compressor(Compressor):
    """Floating-point gradients travel as bfloat16 (``Compression.bf16``): fp32's range, 2 bytes."""

    wire = torch.bfloat16


def _checked(key: str, value: Any, call: str) -> Any:
    """Validates a factory argument with its knob's rules, so that both spellings fail alike."""
    return parse_value(KNOBS_BY_KEY[key], value, f"{call} argument {key.split('_', 1)[1]}")


@dataclass(frozen=True)
class PowerSGD:
    """PowerSGD's settings (Vogels et al., NeurIPS 2019), as ``Compression.powersgd()`` makes them.

    Each compressed gradient, viewed as an n x m matrix M (plus this rank's residual), travels
    as rank-`rank` factors P = M Q and Q = M^T P, one power iteration from the previous step's
    Q with P orthogonalised in between; what the factors miss is kept as the residual and added
    to the next step's gradient (error feedback). docs/compression.md has the algorithm.

    Attributes:
        rank: the factors' rank r, capped per tensor at min(n, m).
        start_step: iterations exchanged uncompressed first (a warm-up).
        min_ratio: a tensor is compressed only if r (n + m) x min_ratio <= n m.
    """

    rank: int = 1
    start_step: int = 0
    min_ratio: float = 2.0

    @property
    def label(self) -> str:
        """The compressor's name in plan policies and reports, e.g. ``powersgd(rank=4)``."""
        return f"powersgd(rank={self.rank})"

    def rank_for(self, shape: Sequence[int]) -> int:
        """The factors' rank for a tensor of `shape`: `rank`, at most min(n, m).

        At min(n, m) the factors already span the whole matrix; a higher rank would only add
        columns of rounding noise to P.
        """
        n, m = matrix_shape(shape)
        return min(self.rank, n, m)

    def compresses(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of `shape` is sent as factors.

        It is when its matrix view n x m (first dimension by the rest) is at least `min_ratio`
        times larger than its factors, r (n + m); 1-D tensors never are.
        """
        if len(shape) < 2 or math.prod(shape) == 0:
            return False
        n, m = matrix_shape(shape)
        return self.rank_for(shape) * (n + m) * self.min_ratio <= n * m


# Deep Gradient Compression's warm-up: the first stage sends a quarter of each tensor's entries,
# each later stage a quarter of the one before (TopK.stages).
WARMUP_FIRST_SHARE = 0.25
WARMUP_SHARE_DIVISOR = 4.0


@dataclass(frozen=True)
class TopK:
    """Top-k's settings, as ``Compression.topk()`` makes them.

    Each compressed gradient (plus this rank's residual) sends the `ratio` share of its entries
    largest in magnitude; the rest is kept as the residual for the next step (error feedback).
    Under torch's SGD with momentum, DGC's momentum correction and masking instead
    (commsched/runtime/compression/dgc_momentum.py). Every rank sends exactly k values and k
    indices, a
    fixed-size all-gather (docs/compression.md).

    Attributes:
        ratio: the share of each compressed tensor's entries sent, in (0, 1].
        start_step: iterations exchanged uncompressed first.
        warmup_steps: iterations after `start_step` over which the share sent falls from
            25% to `ratio` (Deep Gradient Compression's exponential warm-up): `stages()`.
    """

    ratio: float = 0.01
    start_step: int = 0
    warmup_steps: int = 0

    @property
    def label(self) -> str:
        """The compressor's name in plan policies and reports, e.g. ``topk(ratio=0.01)``."""
        if self.warmup_steps and len(self.stages()) > 1:
            return f"topk(ratio={self.ratio:g},warmup_steps={self.warmup_steps})"
        return f"topk(ratio={self.ratio:g})"

    def k(self, numel: int, density: float | None = None) -> int:
        """Entries sent of a tensor of `numel` entries: ceil(density x numel), at least 1.

        Args:
            numel: the tensor's entries.
            density: the share sent; `ratio` when None (a warm-up stage passes its own).

        Returns:
            k, between 1 and `numel`.
        """
        share = self.ratio if density is None else density
        return min(numel, max(1, math.ceil(share * numel)))

    def stages(self) -> tuple[tuple[int, float], ...]:
        """The warm-up's stages: (first iteration, share sent), the last one `ratio` for good.

        Deep Gradient Compression (Lin et al., ICLR 2018) warms up by raising the sparsity
        exponentially over its first epochs. Here the share sent starts at 25% and is
        divided by 4 per stage while it stays above `ratio`; those stages share the
        `warmup_steps` iterations after `start_step` evenly, and `ratio` follows. A warm-up
        shorter than its stages keeps the first of those that would start at the same
        iteration (the densest: it still starts at 25%). Without a warm-up: one stage,
        `ratio` from `start_step` on.

        Returns:
            The stages in order, their first iterations strictly increasing.
        """
        ramp: list[float] = []
        share = WARMUP_FIRST_SHARE
        while self.warmup_steps > 0 and share > self.ratio:
            ramp.append(share)
            share /= WARMUP_SHARE_DIVISOR
        firsts = [self.start_step + i * self.warmup_steps // len(ramp) for i in range(len(ramp))]
        stages = list(zip(firsts, ramp, strict=True))
        stages.append((self.start_step + (self.warmup_steps if ramp else 0), self.ratio))
        return tuple(stage for stage, before in zip(stages, [(-1, 1.0)] + stages[:-1],
                                                    strict=True) if stage[0] > before[0])

    def compresses(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of `shape` is sent as its top k.

        It is when k values plus k int32 indices are at most half of its bytes (for 4-byte
        values: k <= numel / 4); the smallest tensors (biases) go uncompressed.
        """
        numel = math.prod(shape)
        return 0 < numel < 2**31 and 4 * self.k(numel) <= numel


LossyCompression = PowerSGD | TopK


class Compression:
    """What ``DistributedOptimizer(compression=...)`` takes, named as in Horovod.

    ``Compression.none``, ``Compression.fp16`` and ``Compression.bf16`` cast floating-point
    gradients on the wire (lossless apart from rounding; pass the attribute, not a call).
    ``Compression.powersgd(...)`` and ``Compression.topk(...)`` are lossy compressors with error
    feedback: they send a fraction of the bytes and keep what they miss for the next step. All
    of them run under every policy, ``auto`` included; the factors or entries travel as blocks
    of the plan (docs/compression.md). Horovod's ``hvd.Compression.none`` / ``fp16`` are
    accepted too.
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def powersgd(rank: int = 1, start_step: int = 0, min_ratio: float = 2.0) -> PowerSGD:
        """PowerSGD: each matrix gradient travels as two rank-`rank` factors.

        The arguments are checked by the same rules as their knobs (COMMSCHED_POWERSGD_RANK,
        COMMSCHED_POWERSGD_START_STEP, COMMSCHED_POWERSGD_MIN_RATIO).

        Args:
            rank: rank of the P and Q factors, 1 to 1024, capped per tensor at min(n, m)
                (where the average is reproduced exactly). Higher: closer to the true average,
                more bytes.
            start_step: iterations exchanged uncompressed before compression starts (a
                warm-up), 0 or more.
            min_ratio: a tensor (viewed as n x m) is compressed only if its factors are at least
                this many times smaller than it, at least 1; 1-D tensors never are.

        Returns:
            The compressor's settings, for ``compression=``.

        Raises:
            ConfigError: an argument has a value its knob does not allow; the message names it
                and what is allowed.
        """
        call = "Compression.powersgd()"
        return PowerSGD(_checked("powersgd_rank", rank, call),
                        _checked("powersgd_start_step", start_step, call),
                        _checked("powersgd_min_ratio", min_ratio, call))

    @staticmethod
    def topk(ratio: float = 0.01, start_step: int = 0, warmup_steps: int = 0) -> TopK:
        """Top-k: each compressed gradient sends its `ratio` share of largest-magnitude entries.

        Tensors whose k values and k indices would not halve their bytes (biases, small
        layers) are exchanged as usual. Under ``torch.optim.SGD`` with momentum, each rank
        sends from its momentum-corrected velocity (Deep Gradient Compression) and your SGD's
        own momentum is not applied on top; under other optimizers with momentum (Adam), plain
        error feedback, with a warning (docs/compression.md, "Top-k under momentum"). The
        arguments are checked as COMMSCHED_TOPK_RATIO, COMMSCHED_TOPK_START_STEP and
        COMMSCHED_TOPK_WARMUP_STEPS are.

        Args:
            ratio: the share of entries sent, in (0, 1].
            start_step: iterations exchanged uncompressed before compression starts (a
                warm-up, as Deep Gradient Compression's), 0 or more. Under SGD with momentum,
                DGC's velocities then continue from SGD's momentum buffers.
            warmup_steps: iterations after `start_step` over which the share sent falls from
                25% to `ratio`, by a factor of 4 per stage (DGC's exponential warm-up;
                ``TopK.stages()``), 0 or more.

        Returns:
            The compressor's settings, for ``compression=``.

        Raises:
            ConfigError: an argument has a value its knob does not allow.
        """
        call = "Compression.topk()"
        return TopK(_checked("topk_ratio", ratio, call),
                    _checked("topk_start_step", start_step, call),
                    _checked("topk_warmup_steps", warmup_steps, call))


_CASTS: dict[str, type[Compressor]] = {"none": NoneCompressor, "fp16": FP16Compressor,
                                       "bf16": BF16Compressor}


def from_config(cfg: Config) -> type[Compressor] | LossyCompression:
    """The compressor COMMSCHED_COMPRESSION (and its parameters' knobs) name."""
    if cfg.compression == "powersgd":
        return PowerSGD(cfg.powersgd_rank, cfg.powersgd_start_step, cfg.powersgd_min_ratio)
    if cfg.compression == "topk":
        return TopK(cfg.topk_ratio, cfg.topk_start_step, cfg.topk_warmup_steps)
    return _CASTS[cfg.compression]


def resolve(compression: Any) -> type[Compressor] | LossyCompression:
    """What ``compression=`` names: ours, or Horovod's ``hvd.Compression.none`` / ``fp16``.

    Raises:
        ValueError: anything else; the message lists what is accepted.
    """
    if isinstance(compression, (PowerSGD, TopK)):
        return compression
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    name = getattr(compression, "__name__", type(compression).__name__)
    by_horovod_name = {"NoneCompressor": NoneCompressor, "FP16Compressor": FP16Compressor}
    if name in by_horovod_name:
        return by_horovod_name[name]
    raise ValueError(f"compression={compression!r} is not supported: use Compression.none, "
                     "Compression.fp16, Compression.bf16, Compression.powersgd(...) or "
                     "Compression.topk(...)")


def split(compression: type[Compressor] | LossyCompression
          ) -> tuple[type[Compressor], LossyCompression | None]:
    """(the cast the engine applies on the wire, the lossy compressor or None)."""
    if isinstance(compression, (PowerSGD, TopK)):
        return NoneCompressor, compression
    return compression, None
