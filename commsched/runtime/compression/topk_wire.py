"""Top-k's wire tensors, one set per stage of its warm-up (TopK.stages()).

Note [Each warm-up stage has its own wire tensors]
A stage sends k = ceil(share x numel) entries per compressed gradient, so each stage's values
and indices tensors have their own length, and the plan's all-gather blocks with them. Every
stage's tensors are specs of the engine from the bind on (ids after the gradients', stage by
stage), but only the stage in force is in the plan: when the next stage begins, the updates
an overlap plan still defers are applied from the stage that sent them, then the compressor
switches layouts and the plan is rebuilt (as when compression starts mid-run; `auto` chooses
afresh, since every candidate carried the old wire). A checkpoint restores the stage of its
iteration, whose ids its plan carries. The tensors themselves are allocated at their stage's
first hand-over and dropped when it ends: the first stage gathers a quarter of every
compressed gradient from each rank, which no later stage, and no uncompressed iteration
before `start_step`, needs. Plan names show a stage as the compressor's label and its share
(`topk(ratio=0.01,warmup_steps=88)@0.25`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...plan import TensorSpec, dtype_name
from ...plan.compressed import Sparsified, WireLayout, topk_wire


@dataclass
class TopkWire:
    """One stage's layout: per compressed gradient its k and its offset in its dtype's slice,
    the values and int32 indices tensors (world x the dtype's sum of k), while allocated."""

    first_iteration: int
    layout: WireLayout
    k: list[int]
    offset: list[int]
    total: dict[torch.dtype, int]
    values: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    indices: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    # (tensor id, tensor) per wire tensor, in the layout's order: what the last hand-over marks.
    gathered_ids: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def allocate(self, world: int, device: torch.device) -> None:
        """The stage's tensors, zeroed, laid out as its specs say."""
        self.values = {d: torch.zeros(world * n, dtype=d, device=device)
                       for d, n in self.total.items()}
        self.indices = {d: torch.zeros(world * n, dtype=torch.int32, device=device)
                        for d, n in self.total.items()}
        tensors = [t for d in self.total for t in (self.values[d], self.indices[d])]
        for spec, tensor in zip(self.layout.gathered, tensors, strict=True):
            check_wire_tensor(spec, tensor)
        self.gathered_ids = [(s.tensor_id, t)
                             for s, t in zip(self.layout.gathered, tensors, strict=True)]

    def put(self, index: int, dtype: torch.dtype, rank: int, values: torch.Tensor,
            indices: torch.Tensor) -> None:
        """Gradient `index`'s k entries into `rank`'s slice."""
        start = rank * self.total[dtype] + self.offset[index]
        self.values[dtype][start:start + self.k[index]] = values
        self.indices[dtype][start:start + self.k[index]] = indices

    def entries(self, index: int, dtype: torch.dtype,
                world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradient `index`'s entries from every rank (values, indices), once gathered."""
        k, total, offset = self.k[index], self.total[dtype], self.offset[index]
        spans = [slice(r * total + offset, r * total + offset + k) for r in range(world)]
        return (torch.cat([self.values[dtype][span] for span in spans]),
                torch.cat([self.indices[dtype][span] for span in spans]))

    def release(self) -> None:
        self.values, self.indices, self.gathered_ids = {}, {}, []


def topk_stages(label: str, stages: Sequence[tuple[int, float]], specs: Sequence[TensorSpec],
                params: Sequence[torch.Tensor], k_of: Callable[[int, float], int], world: int,
                first_id: int) -> list[TopkWire]:
    """Every stage's layout, its wire tensors' ids consecutive from `first_id` on (stage by
    stage); nothing allocated. `k_of(numel, share)`: TopK.k."""
    wires: list[TopkWire] = []
    next_id = first_id
    for position, (first, share) in enumerate(stages):
        k = [k_of(p.numel(), share) for p in params]
        offset: list[int] = []
        total: dict[torch.dtype, int] = {}
        for p, n in zip(params, k, strict=True):
            offset.append(total.get(p.dtype, 0))
            total[p.dtype] = total.get(p.dtype, 0) + n
        last = position == len(stages) - 1
        tag = "topk" if last else f"topk@{share:g}"
        stage_label = label if last else f"{label}@{share:g}"
        picked = [Sparsified(s, n) for s, n in zip(specs, k, strict=True)]
        layout = topk_wire(stage_label, picked, world, next_id, tag=tag)
        next_id += len(layout.gathered)
        wires.append(TopkWire(first, layout, k, offset, total))
    return wires


class TopkStages:
    """Top-k's warm-up stages and the one in force, whose tensors alone are allocated."""

    def __init__(self, wires: list[TopkWire], world: int, device: torch.device) -> None:
        self.wires = wires
        self._world, self._device = world, device
        self.position = -1
        self.next_at: int | None = None  # where the next stage starts (None: the last is on)
        self.use(0)

    @property
    def current(self) -> TopkWire:
        """The stage in force, its tensors allocated at the first hand-over that needs them
        (none while the run is still uncompressed, or before a restore picks its stage)."""
        wire = self.wires[self.position]
        if wire.total and not wire.gathered_ids:
            wire.allocate(self._world, self._device)
        return wire

    @property
    def layout(self) -> WireLayout:
        """The stage in force's layout (nothing allocated for it)."""
        return self.wires[self.position].layout

    def use(self, position: int) -> bool:
        """Makes stage `position` the one in force; whether it changed."""
        if position == self.position:
            return False
        if self.position >= 0:
            self.wires[self.position].release()
        self.position = position
        following = self.wires[position + 1:]
        self.next_at = following[0].first_iteration if following else None
        return True

    def due(self, iteration: int) -> bool:
        """Whether a later stage than the one in force starts by `iteration`."""
        return self.next_at is not None and iteration >= self.next_at

    def follow(self, iteration: int) -> bool:
        """The stage of `iteration` in force (the first one before it starts); whether it
        changed."""
        return self.use(max([i for i, w in enumerate(self.wires) if w.first_iteration <= iteration],
                            default=0))


def check_wire_tensor(spec: TensorSpec, tensor: torch.Tensor) -> None:
    """A wire tensor must be what its spec (built for the simulator too) describes."""
    if spec.numel != tensor.numel() or spec.dtype != dtype_name(tensor.dtype):
        raise AssertionError(f"commsched: wire tensor {spec.name} is laid out as "
                             f"{spec.numel} x {spec.dtype}, allocated as "
                             f"{tensor.numel()} x {tensor.dtype}")

