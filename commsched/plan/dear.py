"""DeAR (Zhang et al., ICDCS'23): decoupled all-reduce.

Parameters are grouped in forward order into buffers of at most `fusion_threshold` bytes (one
dtype each). Each buffer is reduce-scattered as soon as all its gradients are ready in backward;
its all-gather is a forward-stage block, released just ahead of the forward pass that needs it
(with one block of look-ahead), so the second half of the all-reduce overlaps the next forward.
DeAR's own code reduces only fp32 and hard-codes SGD; here any dtype and the user's optimizer.
"""

from __future__ import annotations

from ..config import Config, Policy
from .types import Block, Collective, Profile, Stage, TensorSpec
from .units import ready_time, whole_pieces


def forward_buffers(specs: list[TensorSpec], threshold: int) -> list[list[TensorSpec]]:
    buffers: list[list[TensorSpec]] = []
    size = 0
    for spec in sorted((s for s in specs if s.numel > 0), key=lambda s: s.forward_index):
        current = buffers[-1] if buffers else None
        if current and current[0].dtype == spec.dtype and size + spec.nbytes <= threshold:
            current.append(spec)
            size += spec.nbytes
        else:
            buffers.append([spec])
            size = spec.nbytes
    return buffers


def plan_dear(specs: list[TensorSpec], profile: Profile, cfg: Config) -> tuple[Block, ...]:
    buffers = forward_buffers(specs, cfg.fusion_bytes(Policy.DEAR))
    # Reduce-scatters in the order their buffers complete in backward (last layers first).
    backward_order = sorted(range(len(buffers)), key=lambda g: (
        max(ready_time(s, profile) for s in buffers[g]), -g))
    blocks = []
    for block_id, g in enumerate(backward_order):
        blocks.append(Block(block_id, whole_pieces(buffers[g]), buffers[g][0].dtype,
                            Collective.REDUCE_SCATTER))
    rs_id = {g: block_id for block_id, g in enumerate(backward_order)}
    for g, buffer in enumerate(buffers):
        blocks.append(Block(len(buffers) + g, whole_pieces(buffer), buffer[0].dtype,
                            Collective.ALL_GATHER, Stage.FORWARD, source=rs_id[g]))
    return tuple(blocks)
