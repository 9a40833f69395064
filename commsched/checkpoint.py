"""The ``commsched`` entry of a wrapped optimizer's ``state_dict()``: the installed plan and
where the run stands (iteration, whether profiling and re-planning are still to come, the
overlap runner's forward order, ``auto``'s bookkeeping).

Why the plan must persist: a plan is built from measured timings, so a resumed job that
profiled again would likely fuse gradients differently, and with three or more ranks a
collective's float sums depend on where a tensor sits in its fused buffer. Restoring the saved
plan (and skipping the profiling already done) makes a resumed run continue bit for bit.

Restoring is local to the rank: ``load_state_dict()`` is also how ``broadcast_optimizer_state``
copies rank 0's state to the others while rank 0 does not load, so it must not start a
collective. When the entry changed this rank's plan or position, the cross-rank comparison of
the restored plan runs before the next iteration's first collective (every rank that loaded the
same entry decides alike, so every rank runs it).
Only plain Python values are stored, so ``torch.load(..., weights_only=True)`` reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .auto import AutoState
from .plan import Block, Collective, Piece, Plan, Stage, TensorSpec

KEY = "commsched"
VERSION = 1


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {"policy": plan.policy, "fingerprint": plan.fingerprint,
            "blocks": [[b.block_id, int(b.op), b.stage.value, b.dtype, b.source,
                        [[p.tensor_id, p.offset, p.numel] for p in b.pieces]]
                       for b in plan.blocks]}


def plan_from_dict(saved: dict[str, Any]) -> Plan:
    blocks = tuple(Block(int(block_id), tuple(Piece(int(t), int(o), int(n)) for t, o, n in pieces),
                         str(dtype), Collective(int(op)), Stage(stage),
                         None if source is None else int(source))
                   for block_id, op, stage, dtype, source, pieces in saved["blocks"])
    plan = Plan(str(saved["policy"]), blocks)
    if plan.fingerprint != saved["fingerprint"]:
        raise ValueError(f"commsched: the checkpoint's plan does not match its own fingerprint "
                         f"({plan.fingerprint} != {saved['fingerprint']}): the entry is damaged")
    return plan


def tensor_signature(specs: list[TensorSpec]) -> list[list[Any]]:
    return [[s.name, s.numel, s.dtype] for s in specs]


_AUTO_FIELDS = ("predicted_s", "measured_s", "replanned", "periods", "history")


def capture(opt: Any) -> dict[str, Any]:
    """The entry for `opt` (a wrapped optimizer) as it stands after a flush."""
    runner = opt._cs_runner
    entry: dict[str, Any] = {
        "version": VERSION, "policy": opt._cs_config.policy.value,
        "tensors": tensor_signature(opt._cs_specs), "plan": plan_to_dict(opt.plan),
        "iteration": opt._cs_iteration, "replan_at": opt._cs_replan_at,
        "credit_bytes": opt._cs_credit,
        "runner": None if runner is None else {"active": runner.active,
                                               "recording": runner.recording,
                                               "order": list(runner.modules.order)},
        "auto": None}
    if opt.auto is not None:
        entry["auto"] = {f: _plain(getattr(opt.auto, f)) for f in _AUTO_FIELDS}
    return entry


def _plain(value: Any) -> Any:
    """Deep copy into lists, dicts and scalars (the loader must not need to trust pickles)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _first_difference(saved: list, ours: list) -> str:
    for index, (a, b) in enumerate(zip(saved, ours, strict=False)):
        if a != b:
            return f"tensor {index} is {a} in the checkpoint and {b} here"
    return f"the checkpoint has {len(saved)} tensors and this optimizer {len(ours)}"


def validate(opt: Any, entry: dict[str, Any]) -> Plan:
    """The saved plan, if it fits this wrap; else a ValueError naming the difference."""
    remedy = ("; load the state_dict without its 'commsched' entry to profile and plan afresh")
    if entry.get("version") != VERSION:
        raise ValueError(f"commsched: checkpoint entry version {entry.get('version')!r} is not "
                         f"{VERSION}{remedy}")
    policy = opt._cs_config.policy.value
    if entry["policy"] != policy:
        raise ValueError(f"commsched: the checkpoint was saved with policy '{entry['policy']}' "
                         f"and this optimizer runs policy '{policy}'{remedy}")
    ours = tensor_signature(opt._cs_specs)
    if entry["tensors"] != ours:
        raise ValueError("commsched: the checkpoint's plan is for other tensors: "
                         f"{_first_difference(entry['tensors'], ours)}{remedy}")
    plan = plan_from_dict(entry["plan"])
    saved_runner = entry["runner"]
    if saved_runner is not None and saved_runner["active"] and opt._cs_runner is None:
        raise ValueError(f"commsched: the checkpoint's plan ({plan.policy}) applies updates in "
                         "the next forward pass and needs DistributedOptimizer(..., model=model)"
                         f"{remedy}")
    return plan


def restore(opt: Any, entry: dict[str, Any]) -> bool:
    """Installs the saved plan on this rank and puts the run where it was saved. Returns
    whether anything changed (then the ranks compare what they restored before going on)."""
    plan = validate(opt, entry)
    changed = [opt.plan.fingerprint, opt._cs_iteration, opt._cs_replan_at] != \
        [plan.fingerprint, entry["iteration"], entry["replan_at"]]
    opt._cs_install_local(plan)
    opt._cs_set_credit(int(entry["credit_bytes"]))
    opt._cs_iteration = int(entry["iteration"])
    replan_at = entry["replan_at"]
    opt._cs_replan_at = None if replan_at is None else int(replan_at)
    runner, saved_runner = opt._cs_runner, entry["runner"]
    if runner is not None and saved_runner is not None:
        # The forward order decides in which module's pre-hook each update runs; without it an
        # activated runner would apply every update before the first layer (correct, no overlap).
        runner.modules.order = list(saved_runner["order"])
        if saved_runner["active"]:
            runner.activate(plan)
        runner.active = bool(saved_runner["active"])
        runner.recording = bool(saved_runner["recording"])
    if opt.auto is not None and entry["auto"] is not None:
        opt.auto = dataclasses.replace(AutoState(), **entry["auto"])
    return changed
