"""Planners on hand-made specs and profiles, with answers worked out by hand."""

from __future__ import annotations

import pytest

from commsched.config import Policy, load_config
from commsched.plan import (
    Collective,
    NetModel,
    Profile,
    Stage,
    TensorSpec,
    make_plan,
    make_profiling_plan,
)
from commsched.plan.bytescheduler import plan_bytescheduler
from commsched.plan.ddp import plan_ddp
from commsched.plan.dear import plan_dear
from commsched.plan.horovod import plan_horovod
from commsched.plan.mgwfbp import plan_mgwfbp
from commsched.plan.prophet import plan_prophet, ready_steps

F32 = ("float32", 4)


def specs_of(sizes: list[int], dtypes: list[tuple[str, int]] | None = None,
             groups: list[int | None] | None = None) -> list[TensorSpec]:
    dtypes = dtypes or [F32] * len(sizes)
    groups = groups or [None] * len(sizes)
    return [TensorSpec(i, f"t{i}", n, d[0], d[1], i, g)
            for i, (n, d, g) in enumerate(zip(sizes, dtypes, groups, strict=True))]


def block_tensors(blocks) -> list[list[int]]:
    return [[p.tensor_id for p in b.pieces] for b in blocks]


def cfg(**kw):
    return load_config(kw, environ={})


def test_profiling_plan_is_reverse_forward_without_profile() -> None:
    plan = make_profiling_plan(specs_of([1, 2, 3]), Profile())
    assert block_tensors(plan.blocks) == [[2], [1], [0]]


def test_horovod_fuses_per_cycle_up_to_threshold() -> None:
    specs = specs_of([100, 100, 100, 100, 100])  # 400 bytes each
    # ready: t4, t3 in cycle 0; t2, t1 in cycle 1 (1 ms cycles); t0 in cycle 3
    profile = Profile((3.5e-3, 1.2e-3, 1.1e-3, 0.5e-3, 0.1e-3))
    blocks = plan_horovod(specs, profile, cfg(fusion_threshold=800, cycle_time=1.0))
    assert block_tensors(blocks) == [[4, 3], [2, 1], [0]]
    small = plan_horovod(specs, profile, cfg(fusion_threshold=500, cycle_time=1.0))
    assert block_tensors(small) == [[4], [3], [2], [1], [0]]


def test_horovod_one_cycle_fuses_everything_and_splits_by_dtype() -> None:
    specs = specs_of([10, 10, 10, 10], [F32, ("float16", 2), F32, ("float16", 2)])
    blocks = plan_horovod(specs, Profile(), cfg())
    assert block_tensors(blocks) == [[3, 1], [2, 0]]
    assert [b.dtype for b in blocks] == ["float16", "float32"]


def test_horovod_groups_stay_together() -> None:
    specs = specs_of([100, 100, 100], groups=[0, None, 0])
    blocks = plan_horovod(specs, Profile((0.0, 0.0, 5e-3)), cfg(fusion_threshold=0))
    assert sorted(map(sorted, block_tensors(blocks))) == [[0, 2], [1]]


def test_ddp_first_bucket_small_then_capacity() -> None:
    specs = specs_of([100] * 6)  # 400 B each, reverse order 5..0
    blocks = plan_ddp(specs, Profile(), cfg(first_bucket_bytes=400, bucket_bytes=1200))
    assert block_tensors(blocks) == [[5], [4, 3, 2], [1, 0]]


def test_ddp_rebuilds_from_observed_order() -> None:
    specs = specs_of([100] * 4)
    observed = Profile((0.3, 0.0, 0.2, 0.1))  # arrival order 1, 3, 2, 0
    blocks = plan_ddp(specs, observed, cfg(first_bucket_bytes=400, bucket_bytes=800))
    assert block_tensors(blocks) == [[1], [3, 2], [0]]


def test_mgwfbp_merges_when_next_is_ready_before_comm_ends() -> None:
    # t(n) = 1 ms + 1 us/B. Gradients 400 B each (1.4 ms) ready every 0.5 ms: each is ready
    # while the previous one would still be on the wire, so all merge.
    specs = specs_of([100, 100, 100])
    net = NetModel(alpha=1e-3, beta=1e-6)
    ready = Profile((1.0e-3, 0.5e-3, 0.0))
    assert block_tensors(plan_mgwfbp(specs, ready, net, cfg())) == [[2, 1, 0]]


def test_mgwfbp_keeps_apart_when_gaps_exceed_comm_time() -> None:
    specs = specs_of([100, 100, 100])
    net = NetModel(alpha=1e-4, beta=1e-7)  # 0.14 ms per tensor
    ready = Profile((20e-3, 10e-3, 0.0))
    assert block_tensors(plan_mgwfbp(specs, ready, net, cfg())) == [[2], [1], [0]]


def test_mgwfbp_never_fuses_past_the_fusion_threshold() -> None:
    # Everything is ready at once, so the wire alone would merge all four (Note [MG-WFBP fuses
    # up to the fusion threshold]). A 4000 B tensor over the 2000 B threshold travels alone; the
    # small ones fuse up to the threshold and no further; 0 disables fusion.
    specs = specs_of([100, 1000, 100, 300])  # 400, 4000, 400 and 1200 B
    net = NetModel(alpha=1e-3, beta=1e-6)
    assert block_tensors(plan_mgwfbp(specs, Profile(), net, cfg())) == [[3, 2, 1, 0]]
    capped = plan_mgwfbp(specs, Profile(), net, cfg(fusion_threshold=2000))
    assert block_tensors(capped) == [[3, 2], [1], [0]]
    assert all(sum(p.numel * 4 for p in b.pieces) <= 2000 or len(b.pieces) == 1 for b in capped)
    off = plan_mgwfbp(specs, Profile(), net, cfg(fusion_threshold=0))
    assert block_tensors(off) == [[3], [2], [1], [0]]


def test_mgwfbp_alpha_rule_for_started_communication() -> None:
    # t2 ready at 0 and starts at once; t1 ready at 0.3 ms while t2's comm (ends 1.4 ms) runs.
    # Waiting 0.3 ms < alpha = 1 ms: merge. With alpha = 0.1 ms the wait is too long: keep apart.
    specs = specs_of([100, 100, 100])
    ready = Profile((50e-3, 0.3e-3, 0.0))
    merged = plan_mgwfbp(specs, ready, NetModel(alpha=1e-3, beta=1e-6), cfg())
    assert block_tensors(merged) == [[2, 1], [0]]
    apart = plan_mgwfbp(specs, ready, NetModel(alpha=1e-4, beta=3.25e-6), cfg())
    assert block_tensors(apart) == [[2], [1], [0]]


def coverage(blocks, stage_ops) -> dict[int, list[tuple[int, int]]]:
    covered: dict[int, list[tuple[int, int]]] = {}
    for block in blocks:
        if block.op in stage_ops:
            for p in block.pieces:
                covered.setdefault(p.tensor_id, []).append((p.offset, p.numel))
    return covered


def test_plans_cover_every_element_once_and_keep_one_dtype_per_block() -> None:
    specs = specs_of([5, 0, 7, 9], [F32, F32, ("float16", 2), F32])
    numel = {s.tensor_id: s.numel for s in specs}
    dtype = {s.tensor_id: s.dtype for s in specs}
    for policy in Policy.planned():
        plan = make_plan(policy, specs, Profile(), NetModel(), cfg(partition_bytes=8))
        ops = ({Collective.REDUCE_SCATTER}, {Collective.ALL_GATHER}) if policy is Policy.DEAR \
            else ({Collective.ALLREDUCE},)
        for stage_ops in ops:
            covered = coverage(plan.blocks, stage_ops)
            assert sorted(covered) == [0, 2, 3], policy  # the empty tensor is not sent
            for tid, pieces in covered.items():
                offsets = sorted(pieces)
                assert offsets[0][0] == 0 and sum(n for _, n in offsets) == numel[tid]
                assert all(a[0] + a[1] == b[0] for a, b in zip(offsets, offsets[1:], strict=False))
        for block in plan.blocks:
            assert {dtype[p.tensor_id] for p in block.pieces} == {block.dtype}
    again = make_plan(Policy.DDP, specs, Profile(), NetModel(), cfg())
    same = make_plan(Policy.DDP, specs, Profile(), NetModel(), cfg())
    horovod = make_plan(Policy.HOROVOD, specs, Profile(), NetModel(), cfg())
    assert again.fingerprint == same.fingerprint
    assert again.fingerprint != horovod.fingerprint


def test_bytescheduler_sends_highest_priority_ready_partition() -> None:
    specs = specs_of([2, 2, 4])  # 8 B, 8 B, 16 B -> t2 splits in two 8 B partitions
    profile = Profile((2e-3, 1e-3, 0.0))
    net = NetModel(alpha=0.0, beta=1.5e-3 / 8)  # 1.5 ms per partition
    blocks = plan_bytescheduler(specs, profile, net, cfg(partition_bytes=8))
    assert [(p.tensor_id, p.offset) for b in blocks for p in b.pieces] == \
        [(2, 0), (1, 0), (0, 0), (2, 2)]
    assert all(len(b.pieces) == 1 for b in blocks)


def test_prophet_sizes_blocks_to_end_as_the_next_step_arrives() -> None:
    specs = specs_of([100, 100, 2000, 1000])  # bytes 400, 400, 8000, 4000
    profile = Profile((10.1e-3, 10e-3, 0.1e-3, 0.0))  # two steps: {t3, t2} then {t1, t0}
    net = NetModel(alpha=0.0, beta=1e-6)  # 10 ms carry 10,000 bytes
    blocks = plan_prophet(specs, profile, net, cfg(partition_bytes=8000))
    # 0 ms: only t3 is ready (4 ms on the wire); 4 ms: t2 (8 ms); 12 ms: t0 and t1 together.
    assert block_tensors(blocks) == [[3], [2], [0, 1]]


def test_prophet_fills_the_gap_before_the_next_step_with_one_block() -> None:
    specs = specs_of([100, 100, 2000, 1000])  # bytes 400, 400, 8000, 4000
    profile = Profile((10.6e-3, 10.5e-3, 0.1e-3, 0.0))  # steps at 0 and 10.5 ms
    net = NetModel(alpha=0.0, beta=1e-6)
    pieces = [[(p.tensor_id, p.offset) for p in b.pieces]
              for b in plan_prophet(specs, profile, net, cfg(partition_bytes=1000))]
    # 0 ms: t3's four 1000 B partitions fit before 10.5 ms: one block, to 4 ms. 4 ms: six of
    # t2's (6000 B <= 6500 B), to 10 ms. 10 ms: one partition (500 B left is under the
    # floor), to 11 ms. Then, the last step in: priority order, t0 + t1 fused, t2's last one.
    assert pieces == [[(3, 0), (3, 250), (3, 500), (3, 750)],
                      [(2, k * 250) for k in range(6)], [(2, 1500)], [(0, 0), (1, 0)],
                      [(2, 1750)]]
    # ByteScheduler sends t2 and t3 one partition per collective: 13 blocks, not 5.
    assert len(plan_bytescheduler(specs, profile, net, cfg(partition_bytes=1000))) == 13


def test_prophet_steps() -> None:
    assert ready_steps([0.0, 0.1, 10.0, 10.1]) == [0.0, 10.0]
    assert ready_steps([0.0, 1.0, 2.0]) == [0.0]


def test_dear_reduce_scatter_in_backward_order_then_all_gather_in_forward_order() -> None:
    specs = specs_of([100, 100, 200, 100])  # 400, 400, 800, 400 bytes
    profile = Profile((3e-3, 2e-3, 1e-3, 0.0))
    blocks = plan_dear(specs, profile, cfg(fusion_threshold=800))
    assert [(b.op, b.stage) for b in blocks] == \
        [(Collective.REDUCE_SCATTER, Stage.BACKWARD)] * 3 \
        + [(Collective.ALL_GATHER, Stage.FORWARD)] * 3
    assert block_tensors(blocks) == [[3], [2], [0, 1], [0, 1], [2], [3]]
    assert [b.source for b in blocks[3:]] == [2, 1, 0]


def test_bytescheduler_fuses_ready_partitions_in_priority_order_up_to_partition_bytes() -> None:
    # 4 B, 4 B, 4 B, 12 B; all but t0 ready at once, t0 later. Blocks of at most 8 B.
    specs = specs_of([1, 1, 1, 3])
    profile = Profile((5e-3, 0.0, 0.0, 0.0))
    net = NetModel(alpha=0.0, beta=1e-3 / 8)  # 1 ms per 8 B
    blocks = plan_bytescheduler(specs, profile, net, cfg(partition_bytes=8))
    # t3 splits into 8 B + 4 B. At t=0: t1+t2 (priority 1, 2) fill one block; then t3's first
    # partition (8 B, full); then t3's 4 B tail alone, since t0 is not ready until 5 ms.
    assert [[(p.tensor_id, p.offset) for p in b.pieces] for b in blocks] == \
        [[(1, 0), (2, 0)], [(3, 0)], [(3, 2)], [(0, 0)]]


def test_bytescheduler_never_fuses_across_dtypes() -> None:
    specs = specs_of([1, 2, 1], [F32, ("float16", 2), F32])  # 4 B, 4 B, 4 B
    blocks = plan_bytescheduler(specs, Profile((0.0, 0.0, 0.0)), NetModel(),
                                cfg(partition_bytes=64))
    assert block_tensors(blocks) == [[0, 2], [1]]


def test_profiling_plan_for_dear_and_auto_times_every_collective() -> None:
    specs = specs_of([4, 4, 4])
    plain = make_profiling_plan(specs, Profile())
    assert {b.op for b in plain.blocks} == {Collective.ALLREDUCE}
    for policy in (Policy.DEAR, Policy.AUTO):
        plan = make_profiling_plan(specs, Profile(), policy)
        assert [b.op for b in plan.blocks] == [Collective.ALLREDUCE, Collective.REDUCE_SCATTER,
                                               Collective.ALL_GATHER, Collective.ALLREDUCE]
        scatter, gather = plan.blocks[1], plan.blocks[2]
        assert gather.source == scatter.block_id and gather.pieces == scatter.pieces
        assert all(b.stage is Stage.BACKWARD for b in plan.blocks)  # synchronous: nothing deferred


def test_decoupled_profiling_alternates_by_size() -> None:
    # Two large and two small tensors: each collective must be timed on a large one.
    specs = specs_of([1000, 800, 2, 3])
    plan = make_profiling_plan(specs, Profile(), Policy.AUTO)
    ops_of: dict[int, set[Collective]] = {}
    for block in plan.blocks:
        for piece in block.pieces:
            ops_of.setdefault(piece.tensor_id, set()).add(block.op)
    assert ops_of[0] == {Collective.ALLREDUCE}
    assert ops_of[1] == {Collective.REDUCE_SCATTER, Collective.ALL_GATHER}
    assert {frozenset(ops_of[2]), frozenset(ops_of[3])} == \
        {frozenset({Collective.ALLREDUCE}),
         frozenset({Collective.REDUCE_SCATTER, Collective.ALL_GATHER})}


@pytest.mark.parametrize("sizes", [[1000, 800, 3, 2], [1000, 800, 2], [5, 9], [4, 9, 7, 1000, 2]])
def test_decoupled_profiling_opens_with_an_all_reduce(sizes: list[int]) -> None:
    # Note [The block that opens the backward]: the first block's wait for the latest rank
    # must not land in the small reduce-scatter fit. Without a profile the last tensor in
    # forward order is ready first; in the first case it is the smallest, which the plain
    # alternation by size would decouple.
    plan = make_profiling_plan(specs_of(sizes), Profile(), Policy.AUTO)
    assert plan.blocks[0].op is Collective.ALLREDUCE
    assert plan.blocks[0].pieces[0].tensor_id == len(sizes) - 1
    scattered = [sum(p.numel for p in b.pieces) for b in plan.blocks
                 if b.op is Collective.REDUCE_SCATTER]
    reduced = [sum(p.numel for p in b.pieces) for b in plan.blocks if b.op is Collective.ALLREDUCE]
    assert scattered and reduced
    if len(sizes) >= 4:  # each fit still has a large and a small sample
        assert len(set(scattered)) >= 2 and len(set(reduced)) >= 2
