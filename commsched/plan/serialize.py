"""Plans as plain data (checkpoints, broadcasts) and the dtype names plans are written in.

Only lists, strings and numbers, so that ``torch.load(..., weights_only=True)`` reads a
checkpoint holding a plan, and a damaged entry is caught by its own fingerprint.
"""

from __future__ import annotations

from typing import Any

from .types import Block, Collective, Piece, Plan, Stage, UpdateGroup


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``"float32"`` (the form TensorSpec and Block carry)."""
    return str(dtype).removeprefix("torch.")


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {"policy": plan.policy, "fingerprint": plan.fingerprint,
            "blocks": [[b.block_id, int(b.op), b.stage.value, b.dtype, b.source,
                        [[p.tensor_id, p.offset, p.numel] for p in b.pieces]]
                       for b in plan.blocks],
            "update_groups": [[g.module, list(g.tensor_ids), g.wait_for]
                              for g in plan.update_groups]}


def plan_from_dict(saved: dict[str, Any]) -> Plan:
    blocks = tuple(Block(int(block_id), tuple(Piece(int(t), int(o), int(n)) for t, o, n in pieces),
                         str(dtype), Collective(int(op)), Stage(stage),
                         None if source is None else int(source))
                   for block_id, op, stage, dtype, source, pieces in saved["blocks"])
    groups = tuple(UpdateGroup(str(module), tuple(int(t) for t in tids), int(wait_for))
                   for module, tids, wait_for in saved.get("update_groups", ()))
    plan = Plan(str(saved["policy"]), blocks, groups)
    if plan.fingerprint != saved["fingerprint"]:
        raise ValueError(f"commsched: the checkpoint's plan does not match its own fingerprint "
                         f"({plan.fingerprint} != {saved['fingerprint']}): the entry is damaged")
    return plan
