"""Gradient compression by casting on the wire, Horovod's interface plus bf16.

The engine casts while packing the fusion buffer (``wire_dtype``), so a compressor here is a
description of the cast; ``compress``/``decompress`` keep Horovod's calling convention for code
that uses them directly.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    wire: torch.dtype | None = None  # None: send as is

    @classmethod
    def wire_dtype(cls, dtype: torch.dtype) -> torch.dtype:
        if cls.wire is None or not dtype.is_floating_point:
            return dtype
        return cls.wire

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor.to(cls.wire_dtype(tensor.dtype)), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx)


class NoneCompressor(Compressor):
    wire = None


class FP16Compressor(Compressor):
    wire = torch.float16


class BF16Compressor(Compressor):
    wire = torch.bfloat16


class Compression:
    """Namespace as in Horovod: ``Compression.none``, ``Compression.fp16``, plus ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def resolve(compression: Any) -> type[Compressor]:
    """Accepts ours or Horovod's ``hvd.Compression.none`` / ``fp16``."""
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    name = getattr(compression, "__name__", type(compression).__name__)
    by_horovod_name = {"NoneCompressor": NoneCompressor, "FP16Compressor": FP16Compressor}
    if name in by_horovod_name:
        return by_horovod_name[name]
    raise ValueError(f"compression={compression!r} is not supported: use Compression.none, "
                     "Compression.fp16 or Compression.bf16")
