"""Planners on hand-made specs and profiles, with answers worked out by hand."""

from __future__ import annotations

from commsched.config import Policy, load_config
from commsched.plan import NetModel, Profile, TensorSpec, make_plan, make_profiling_plan
from commsched.plan.ddp import plan_ddp
from commsched.plan.horovod import plan_horovod
from commsched.plan.mgwfbp import plan_mgwfbp

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


def test_mgwfbp_alpha_rule_for_started_communication() -> None:
    # t2 ready at 0 and starts at once; t1 ready at 0.3 ms while t2's comm (ends 1.4 ms) runs.
    # Waiting 0.3 ms < alpha = 1 ms: merge. With alpha = 0.1 ms the wait is too long: keep apart.
    specs = specs_of([100, 100, 100])
    ready = Profile((50e-3, 0.3e-3, 0.0))
    merged = plan_mgwfbp(specs, ready, NetModel(alpha=1e-3, beta=1e-6), cfg())
    assert block_tensors(merged) == [[2, 1], [0]]
    apart = plan_mgwfbp(specs, ready, NetModel(alpha=1e-4, beta=3.25e-6), cfg())
    assert block_tensors(apart) == [[2], [1], [0]]


def test_plans_cover_every_tensor_once_and_fingerprints_differ() -> None:
    specs = specs_of([5, 0, 7, 9], [F32, F32, ("float16", 2), F32])
    fingerprints = set()
    for policy in Policy:
        plan = make_plan(policy, specs, Profile(), NetModel(), cfg())
        assert sorted(plan.tensor_ids()) == [0, 2, 3]  # the empty tensor is not sent
        for block in plan.blocks:
            assert len({s.dtype for s in specs if s.tensor_id in [p.tensor_id for p in block.pieces]}) == 1
        fingerprints.add(plan.fingerprint)
    assert make_plan(Policy.DDP, specs, Profile(), NetModel(), cfg()).fingerprint == \
        make_plan(Policy.DDP, specs, Profile(), NetModel(), cfg()).fingerprint
    assert len(fingerprints) >= 2
