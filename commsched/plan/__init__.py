"""Planners: pure functions from (policy, tensor specs, profile, network model, config) to a Plan.

One module per policy; no processes, no torch.distributed.
"""

from __future__ import annotations

from ..config import Config, Policy
from .bytescheduler import plan_bytescheduler
from .ddp import plan_ddp
from .dear import plan_dear
from .horovod import plan_horovod
from .mgwfbp import plan_mgwfbp
from .prophet import plan_prophet
from .serialize import dtype_name, plan_from_dict, plan_to_dict
from .types import (
    Block,
    Collective,
    NetModel,
    Piece,
    Plan,
    Profile,
    Stage,
    TensorSpec,
    UpdateGroup,
)
from .units import layerwise, layerwise_decoupled

PROFILING_POLICY = "layerwise"


def is_profiling_plan(plan: Plan) -> bool:
    """Whether `plan` is the profiling steps' plan, also under a lossy compressor (whose plans
    are named `<policy>+<compressor>`: compressed.compressed_plan)."""
    return plan.policy.split("+", 1)[0] == PROFILING_POLICY


def make_plan(policy: Policy, specs: list[TensorSpec], profile: Profile, net: NetModel,
              cfg: Config) -> Plan:
    if policy is Policy.HOROVOD:
        blocks = plan_horovod(specs, profile, cfg)
    elif policy is Policy.DDP:
        blocks = plan_ddp(specs, profile, cfg)
    elif policy is Policy.MGWFBP:
        blocks = plan_mgwfbp(specs, profile, net, cfg)
    elif policy is Policy.BYTESCHEDULER:
        blocks = plan_bytescheduler(specs, profile, net, cfg)
    elif policy is Policy.PROPHET:
        blocks = plan_prophet(specs, profile, net, cfg)
    elif policy is Policy.DEAR:
        blocks = plan_dear(specs, profile, cfg)
    else:  # pragma: no cover - Policy is closed
        raise ValueError(f"no planner for policy {policy!r}")
    return Plan(policy.value, blocks)


def make_profiling_plan(specs: list[TensorSpec], profile: Profile,
                        policy: Policy | None = None) -> Plan:
    if policy in (Policy.DEAR, Policy.AUTO):
        return Plan(PROFILING_POLICY, layerwise_decoupled(specs, profile))
    return Plan(PROFILING_POLICY, layerwise(specs, profile))


__all__ = ["Block", "Collective", "NetModel", "Piece", "Plan", "Profile", "Stage", "TensorSpec",
           "UpdateGroup",
           "dtype_name", "is_profiling_plan", "make_plan", "make_profiling_plan",
           "plan_from_dict", "plan_to_dict",
           "PROFILING_POLICY"]
