"""What a wrap was given (validated options) and the per-parameter specs a session plans with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..compression import Compressor, LossyCompression
from ..config import Config
from ..ops import ReduceOp
from ..plan import TensorSpec, dtype_name
from ..world import World, check_identical, parameter_signature

TOO_MANY_BACKWARDS = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally.")


@dataclass(frozen=True)
class WrapOptions:
    """What DistributedOptimizer was given, validated."""

    compression: type[Compressor]
    backward_passes_per_step: int
    op: ReduceOp
    predivide: float
    group_of: dict[int, int]
    sparse_as_dense: bool
    model: Any
    # PowerSGD or top-k (commsched.runtime.compression.gradients)
    lossy: LossyCompression | None = None
    process_set: Any = None  # Horovod's: an hvd.ProcessSet or a list of ranks; None: every rank


def make_specs(named: Sequence[tuple[str, torch.Tensor]],
               group_of: dict[int, int]) -> list[TensorSpec]:
    """One spec per parameter that needs a gradient, in forward (declaration) order."""
    specs: list[TensorSpec] = []
    for name, p in named:
        if not p.requires_grad:
            continue
        tid = len(specs)
        specs.append(TensorSpec(tid, name, p.numel(), dtype_name(p.dtype), p.element_size(),
                                forward_index=tid, group=group_of.get(id(p))))
    return specs


def dense_layout(param: torch.Tensor) -> torch.Tensor:
    """The gradient in row-major layout (channels-last or transposed parameters get strided
    gradients): the engine splits gradients into partitions of the flattened tensor and reduces
    them in place, which needs one contiguous buffer. The optimizer accepts either layout."""
    grad = param.grad
    assert grad is not None
    if not grad.is_contiguous():
        param.grad = grad = grad.contiguous()
    return grad


def check_ranks_agree(world: World, config: Config, options: WrapOptions,
                      specs: list[TensorSpec], params: list[torch.Tensor],
                      routed: list[tuple[str, torch.Tensor]]) -> None:
    """Every rank wrapped the same parameters with the same settings (MismatchError naming the
    first difference otherwise)."""
    check_identical(world, "wrapped parameters (name, shape, dtype)",
                    parameter_signature(specs, [tuple(p.shape) for p in params]))
    settings = {**config.as_dict(), "timeline": None,
                "compression": options.compression.__name__, "op": options.op.name,
                "lossy": None if options.lossy is None else repr(options.lossy),
                "backward_passes_per_step": options.backward_passes_per_step,
                "gradient_predivide_factor": options.predivide,
                "groups": [s.group for s in specs],
                "sparse": [[n, list(p.shape), str(p.dtype)] for n, p in routed],
                "process_set": world.members}
    check_identical(world, "DistributedOptimizer settings", sorted(settings.items()))
