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

from collections.abc import Callable, Sequence
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
    # Gradient id -> the wire tensors its reduced value is rebuilt from (PowerSGD: its P and Q;
    # top-k: the gathered tensors): an overlap plan updates it once their blocks are done.
    carriers: dict[int, tuple[int, ...]] = field(default_factory=dict)


PlanBuilder = Callable[[list[TensorSpec], Profile], Plan]


@dataclass(frozen=True)
class Factored:
    """A gradient sent as PowerSGD factors: its matrix view rows x cols, the factors' rank."""

    spec: TensorSpec
    rows: int
    cols: int
    rank: int


@dataclass(frozen=True)
class Sparsified:
    """A gradient sent as its k largest entries (values and int32 indices)."""

    spec: TensorSpec
    k: int


INDEX_DTYPE, INDEX_SIZE = "int32", 4


def powersgd_wire(label: str, factored: Sequence[Factored], first_id: int) -> WireLayout:
    """The wire tensors of PowerSGD: per gradient a P (rows x rank), then per gradient a Q
    (cols x rank), with ids from `first_id` on. The run (commsched.runtime.compression.gradients)
    and the
    simulator both build the layout here, so the simulated sizes are the real ones."""
    p_specs = [TensorSpec(first_id + i, f"{f.spec.name}/powersgd.P", f.rows * f.rank,
                          f.spec.dtype, f.spec.element_size, forward_index=f.spec.tensor_id)
               for i, f in enumerate(factored)]
    q_first = first_id + len(factored)
    q_specs = [TensorSpec(q_first + i, f"{f.spec.name}/powersgd.Q", f.cols * f.rank,
                          f.spec.dtype, f.spec.element_size, forward_index=f.spec.tensor_id)
               for i, f in enumerate(factored)]
    source = {p.tensor_id: f.spec.tensor_id for p, f in zip(p_specs, factored, strict=True)}
    carriers: dict[int, tuple[int, ...]] = {
        f.spec.tensor_id: (p.tensor_id, q.tensor_id)
        for f, p, q in zip(factored, p_specs, q_specs, strict=True)}
    return WireLayout(label, frozenset(f.spec.tensor_id for f in factored), early=tuple(p_specs),
                      late=tuple(q_specs), source=source, carriers=carriers)


def topk_wire(label: str, picked: Sequence[Sparsified], world: int,
              first_id: int, tag: str = "topk") -> WireLayout:
    """The wire tensors of top-k: per dtype (in order of first appearance), one values and one
    int32 indices tensor of world x (sum of k) entries, named `tag`.values.<dtype> and
    `tag`.indices.<dtype>; ids from `first_id` on."""
    totals: dict[str, tuple[int, int]] = {}  # dtype -> (element size, sum of k)
    for s in picked:
        size, total = totals.get(s.spec.dtype, (s.spec.element_size, 0))
        totals[s.spec.dtype] = (size, total + s.k)
    gathered: list[TensorSpec] = []
    of_dtype: dict[str, tuple[int, ...]] = {}
    for dtype, (size, total) in totals.items():
        for what, wire_dtype, wire_size in (("values", dtype, size),
                                            ("indices", INDEX_DTYPE, INDEX_SIZE)):
            tensor_id = first_id + len(gathered)
            gathered.append(TensorSpec(tensor_id, f"{tag}.{what}.{dtype}", world * total,
                                       wire_dtype, wire_size, forward_index=tensor_id))
            of_dtype[dtype] = of_dtype.get(dtype, ()) + (tensor_id,)
    return WireLayout(label, frozenset(s.spec.tensor_id for s in picked),
                      gathered=tuple(gathered),
                      carriers={s.spec.tensor_id: of_dtype[s.spec.dtype] for s in picked})


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
