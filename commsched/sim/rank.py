"""Ranking every plan valid for a wrapper by simulated iteration time (the `auto` policy and the
what-if table both use it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import Config, Policy, load_config
from ..plan import NetModel, Plan, TensorSpec, make_plan
from ..plan.sharding import SHARDABLE_POLICIES
from .compressed import CompressedRun
from .network import Network
from .overlap import with_update_groups
from .profile import RunProfile, ready_profile, specs_from_profile
from .simulator import Mode, SimResult, simulate

MiB = 1 << 20

# A small grid: rank_candidates runs inside training when the plan is chosen. Credit
# (credit_bytes) is not searched: on the simulator's serial channel it paces launches without
# changing when blocks finish, so every credit value would predict the same (Note [Credit
# follows the partition] says what the partitioning policies get).
KNOB_GRID: dict[str, dict[str, tuple[int, ...]]] = {
    "horovod": {"fusion_threshold": (4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB)},
    "ddp": {"bucket_bytes": (1 * MiB, 4 * MiB, 25 * MiB)},
    "mgwfbp": {},
    "bytescheduler": {"partition_bytes": (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB)},
    "prophet": {"partition_bytes": (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB)},
    "dear": {"fusion_threshold": (4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB)},
}

# Note [Credit follows the partition]
# ByteScheduler's credit is a window of partitions: the priority queue only orders what is not
# launched yet, and a block once launched runs (or shares the link) ahead of anything launched
# after it, so with the configured 16 MiB credit up to sixteen 1 MiB partitions of later layers
# can be committed ahead of a block the next forward pass waits for. The benchmarks'
# partitioning candidates run a credit of two partitions (one on the wire, one staged); `auto`'s
# bytescheduler 1 MiB with the configured credit measured slower than that candidate on the
# 2-rank Transformer at 1 Gbit/s (the overlap benchmark's run of 2026-11-25), which left `auto`
# outside the benchmarks' tolerance of the fastest (figures: benchmarks/notes/README.md,
# 'Credit follows the partition'). So a partitioning policy's candidate carries
# CREDIT_PARTITIONS x its partition size as its credit; the simulator cannot rank credits
# (above), so `auto` does not search them.
CREDIT_PARTITIONS = 2

# Planners that read the network model; the others' plans can be cached across networks.
NET_DEPENDENT = ("mgwfbp", "bytescheduler", "prophet")


@dataclass(frozen=True)
class Ranked:
    policy: Policy
    knobs: dict[str, int]
    plan: Plan
    predicted_s: float
    result: SimResult | None = field(default=None, compare=False, repr=False)


def planned_policies() -> list[Policy]:
    """Every policy with a planner, in declaration order (`auto` is not one)."""
    return [p for p in Policy if p.value != "auto"]


def mode_of(policy: Policy) -> Mode:
    return Mode.OVERLAP if policy.overlaps_iterations else Mode.SYNC


def knob_grid(policy: Policy) -> list[dict[str, int]]:
    grid: list[dict[str, int]] = [{}]
    for key, values in KNOB_GRID.get(policy.value, {}).items():
        grid = [{**knobs, key: v} for knobs in grid for v in values]
    return [with_credit(knobs) for knobs in grid]


def with_credit(knobs: dict[str, int]) -> dict[str, int]:
    """`knobs` with a partitioning policy's credit (Note [Credit follows the partition])."""
    partition = knobs.get("partition_bytes")
    if partition is None or "credit_bytes" in knobs:
        return knobs
    return {**knobs, "credit_bytes": CREDIT_PARTITIONS * partition}


def planner_model(net: Network, cfg: Config) -> NetModel:
    """What the planners get, as in the optimizer: the all-reduce fit, or the configured
    alpha/beta where set."""
    fitted = net.allreduce_model()
    return NetModel(fitted.alpha if cfg.alpha is None else cfg.alpha,
                    fitted.beta if cfg.beta is None else cfg.beta)


class PlanCache:
    """Plans by (policy, knobs, planner network); plans of net-independent policies are reused
    for every network, which keeps what-if sweeps fast."""

    def __init__(self, run: RunProfile, base_cfg: Config,
                 compressed: CompressedRun | None = None) -> None:
        """`compressed`: plans carry a lossy compressor's wire tensors (`run` is then
        compressed.run) and simulations add its compute."""
        self.compressed = compressed
        self.compressor = None if compressed is None else compressed.compute
        run = run if compressed is None else compressed.run
        self.run = run
        self.specs: list[TensorSpec] = specs_from_profile(run)
        self.profile = ready_profile(run)
        self.base = {k: v for k, v in base_cfg.as_dict().items() if v is not None}
        self.base_cfg = base_cfg
        self._plans: dict[tuple[Any, ...], Plan] = {}

    def config(self, policy: Policy, knobs: dict[str, int]) -> Config:
        return load_config({**self.base, **knobs, "policy": policy.value}, environ={})

    def plan(self, policy: Policy, knobs: dict[str, int], net: Network) -> Plan:
        model = planner_model(net, self.base_cfg)
        # Overlap plans' update groups follow the network too (when blocks complete).
        key: tuple[Any, ...] = (policy.value, tuple(sorted(knobs.items())),
                                model if policy.value in NET_DEPENDENT else None,
                                repr(net) if policy.overlaps_iterations else None)
        plan = self._plans.get(key)
        if plan is None:
            cfg = self.config(policy, knobs)
            if self.compressed is not None:
                plan = self.compressed.plan(lambda specs, prof: make_plan(policy, specs, prof,
                                                                          model, cfg))
            else:
                plan = make_plan(policy, self.specs, self.profile, model, cfg)
            if policy.overlaps_iterations:
                plan = with_update_groups(self.run, plan, net, self.compressor)
            self._plans[key] = plan
        return plan


def allowed_policies(run: RunProfile, overlap_allowed: bool, sharded: bool = False
                     ) -> list[Policy]:
    """The planned policies a wrapper may run: the overlap ones only where allowed and
    simulable, and under shard_optimizer only those whose plans run sharded."""
    return [p for p in planned_policies()
            if (not p.overlaps_iterations or (overlap_allowed and run.has_module_info))
            and (not sharded or p.value in SHARDABLE_POLICIES)]


def evaluate(cache: PlanCache, policies: list[Policy], net: Network,
             tune: bool = True, shards: int = 1) -> list[Ranked]:
    """Every (policy, knobs) candidate simulated on `net`, fastest first; ties go to the
    earlier policy (declaration order), then the smaller knobs, so every rank picks the same.
    Without `tune`, each policy runs with the base configuration's knobs only. `shards` > 1:
    each runs sharded over that many ranks (simulate's `shards`)."""
    order = {p: i for i, p in enumerate(planned_policies())}
    out = []
    for policy in policies:
        for knobs in knob_grid(policy) if tune else [{}]:
            plan = cache.plan(policy, knobs, net)
            result = simulate(cache.run, plan, net, mode_of(policy),
                              compressor=cache.compressor, shards=shards)
            out.append(Ranked(policy, knobs, plan, result.iteration_s, result))
    out.sort(key=lambda r: (r.predicted_s, order[r.policy], sorted(r.knobs.items())))
    return out


def rank_candidates(run: RunProfile, net: Network, base_cfg: Config,
                    overlap_allowed: bool, compressed: CompressedRun | None = None,
                    shards: int = 1) -> list[Ranked]:
    """Every plan valid for the wrapper over the knob grid, by predicted iteration time.

    Args:
        run: the profile.
        net: the network.
        base_cfg: the wrapper's configuration (knobs outside the grid).
        overlap_allowed: whether the wrapper may run an overlap policy (model= given, a
            splittable optimizer); they are candidates only when the profile also has module
            information to simulate them.
        compressed: `run` with a lossy compressor's wire tensors, which every candidate carries.
        shards: under shard_optimizer the world size: only the policies whose plans run
            sharded are candidates, each simulated sharded (`auto` never shards on its own).

    Returns:
        The candidates, fastest first.
    """
    policies = allowed_policies(run, overlap_allowed, sharded=shards > 1)
    return evaluate(PlanCache(run, base_cfg, compressed), policies, net, shards=shards)
