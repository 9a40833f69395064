"""Plans for compressed gradients: the compressor's factors as wire tensors of the plan.

Note [Compressed tensors are blocks of the plan]
A compressed gradient is in no block; its wire tensors are, and the policy's own planner
arranges them like gradients, so fusion, priority, partitions and credit apply to them:

    PowerSGD: per compressed tensor, P (n x r) is ready when its gradient is (the hook computes
              P = M Q at once) and is planned with the uncompressed gradients; Q (m x r) is ready
              only once P's block was reduced and orthogonalised on the training thread, so
              every Q comes after every P, in blocks planned by the same policy and appended
              at the end. The training thread releases the Qs in plan order after waiting for
              the blocks before them, so the engine, which launches in plan order, never waits
              for a Q whose P comes later (no deadlock, whatever the policy fused).
    top-k:    every compressed tensor's k values and k int32 indices, one all-gather block per
              dtype of fixed size (world x sum of k): rank r fills the r-th slice, every rank
              gets every rank's entries (the engine's standalone all-gather). A fixed size makes
              the plan static and identical on every rank; the blocks go last (they are filled
              when the last compressed gradient is in).

Wire tensors take tensor ids after the gradients'. Their numels encode the compressor's
configuration and shapes, and the plan's policy names the compressor, so the plan's
fingerprint, which every rank compares before installing it, covers both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .types import Block, Collective, Piece, Plan, Profile, TensorSpec


@dataclass(frozen=True)
class WireLayout:
    """What replaces the compressed gradients on the wire (see the Note above)."""

    label: str  # e.g. "powersgd(rank=4)": part of the plan's policy name
    compressed: frozenset[int]  # gradient tensor ids that travel as wire tensors instead
    early: tuple[TensorSpec, ...] = ()  # planned with the gradients (PowerSGD's P)
    late: tuple[TensorSpec, ...] = ()  # planned after them (PowerSGD's Q)
    gathered: tuple[TensorSpec, ...] = ()  # all-gathered at the end (top-k's values, indices)
    source: dict[int, int] = field(default_factory=dict)  # wire id -> its gradient's id


PlanBuilder = Callable[[list[TensorSpec], Profile], Plan]


def _with_source_times(profile: Profile, layout: WireLayout) -> Profile:
    """A wire tensor is ready no sooner than its gradient: until compressed steps were profiled
    its own time is unknown (0), and the gradient's keeps it from heading the plan."""
    if not profile.measured:
        return profile
    times = list(profile.ready_times)
    for wire, grad in layout.source.items():
        if wire < len(times) and grad < len(times):
            times[wire] = max(times[wire], times[grad])
    return Profile(tuple(times))


def _renumbered(blocks: list[Block]) -> tuple[Block, ...]:
    out: list[Block] = []
    for block in blocks:
        offset = len(out) - block.block_id
        source = None if block.source is None else block.source + offset
        out.append(Block(len(out), block.pieces, block.dtype, block.op, block.stage, source))
    return tuple(out)


def compressed_plan(build: PlanBuilder, specs: list[TensorSpec], layout: WireLayout,
                    profile: Profile) -> Plan:
    """The policy's plan (`build`) over the uncompressed gradients and the early wire tensors,
    then its plan over the late ones, then the gathered blocks."""
    profile = _with_source_times(profile, layout)
    kept = [s for s in specs if s.tensor_id not in layout.compressed]
    first = build(kept + list(layout.early), profile)
    blocks = list(first.blocks)
    if layout.late:
        blocks += [_shifted(b, len(blocks)) for b in build(list(layout.late), profile).blocks]
    for dtype in sorted({s.dtype for s in layout.gathered}):
        pieces = tuple(Piece(s.tensor_id, 0, s.numel) for s in layout.gathered if s.dtype == dtype)
        blocks.append(Block(len(blocks), pieces, dtype, Collective.ALL_GATHER))
    return Plan(f"{first.policy}+{layout.label}", _renumbered(blocks))


def _shifted(block: Block, by: int) -> Block:
    source = None if block.source is None else block.source + by
    return Block(block.block_id + by, block.pieces, block.dtype, block.op, block.stage, source)


def check_order(plan: Plan, layout: WireLayout) -> None:
    """Every late wire tensor's block comes after every early one's (the Note's invariant)."""
    position = {p.tensor_id: i for i, b in enumerate(plan.blocks) for p in b.pieces}
    early = [position[s.tensor_id] for s in layout.early]
    late = [position[s.tensor_id] for s in layout.late]
    if early and late and min(late) <= max(early):
        raise AssertionError(f"commsched: plan {plan.policy} puts a Q block before a P block")
