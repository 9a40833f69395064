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
Only plain Python values and tensors are stored, so ``torch.load(..., weights_only=True)`` reads
them. A lossy compressor's state (error-feedback residuals, PowerSGD's warm-start Q) is in the
entry too (Note [Residuals are per rank, Q is shared], commsched/runtime/compression/gradients.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..plan import Plan, TensorSpec, plan_from_dict, plan_to_dict
from .planning.auto.state import AutoState

if TYPE_CHECKING:
    from .session import Session

KEY = "commsched"
VERSION = 1


def tensor_signature(specs: list[TensorSpec]) -> list[list[Any]]:
    return [[s.name, s.numel, s.dtype] for s in specs]


_AUTO_FIELDS = ("predicted_s", "measured_s", "replanned", "periods", "history", "refined",
                "refining")


def capture(session: Session) -> dict[str, Any] | None:
    """The entry for `session` (a wrapped optimizer's) as it stands after a flush; None before
    an elastic job's first step (no plan yet: Horovod's TorchState saves the state at wrap)."""
    if not session.bound:
        return None
    lifecycle = session.lifecycle
    entry: dict[str, Any] = {
        "version": VERSION, "policy": session.config.policy.value,
        "tensors": tensor_signature(session.specs), "plan": plan_to_dict(session.plan),
        "iteration": session.state.iteration, "replan_at": lifecycle.replan_at,
        "credit_bytes": lifecycle.credit,
        "runner": session.modes.state_dict(),
        "auto": None,
        "compression": None if session.compressed is None else session.compressed.state()}
    if lifecycle.auto is not None:
        entry["auto"] = {f: _plain(getattr(lifecycle.auto, f)) for f in _AUTO_FIELDS}
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


def validate(session: Session, entry: dict[str, Any]) -> Plan:
    """The saved plan, if it fits this wrap; else a ValueError naming the difference."""
    remedy = ("; load the state_dict without its 'commsched' entry to profile and plan afresh")
    if entry.get("version") != VERSION:
        raise ValueError(f"commsched: checkpoint entry version {entry.get('version')!r} is not "
                         f"{VERSION}{remedy}")
    policy = session.config.policy.value
    if entry["policy"] != policy:
        raise ValueError(f"commsched: the checkpoint was saved with policy '{entry['policy']}' "
                         f"and this optimizer runs policy '{policy}'{remedy}")
    ours = tensor_signature(session.specs)
    if entry["tensors"] != ours:
        raise ValueError("commsched: the checkpoint's plan is for other tensors: "
                         f"{_first_difference(entry['tensors'], ours)}{remedy}")
    plan = plan_from_dict(entry["plan"])
    saved_runner = entry["runner"]
    if saved_runner is not None and saved_runner["active"] and session.options.model is None:
        raise ValueError(f"commsched: the checkpoint's plan ({plan.policy}) applies updates in "
                         "the next forward pass and needs DistributedOptimizer(..., model=model)"
                         f"{remedy}")
    saved_compression = entry.get("compression")
    if (saved_compression is None) != (session.options.lossy is None):
        raise ValueError("commsched: the checkpoint was saved "
                         + ("without" if saved_compression is None else "with")
                         + " lossy compression and this optimizer runs "
                         + ("with" if saved_compression is None else "without") + f" it{remedy}")
    if session.compressed is not None and saved_compression is not None:
        session.compressed.check_state(saved_compression)
    return plan


def restore(session: Session, entry: dict[str, Any]) -> None:
    """Installs the saved plan on this rank and puts the run where it was saved. When anything
    changed, the ranks compare what they restored before the next collective."""
    plan = validate(session, entry)
    if session.binding.stale:
        # An elastic job restoring its last commit after losing a worker: the plan was for a
        # world that is gone; the re-formed one plans for its own size from this iteration.
        session.state.iteration = int(entry["iteration"])
        return
    lifecycle = session.lifecycle
    replan_at = None if entry["replan_at"] is None else int(entry["replan_at"])
    changed = [session.plan.fingerprint, session.state.iteration, lifecycle.replan_at] != \
        [plan.fingerprint, entry["iteration"], replan_at]
    lifecycle.restored(plan, replan_at, int(entry["credit_bytes"]), compare=changed)
    session.state.iteration = int(entry["iteration"])
    if session.compressed is not None:
        session.compressed.load(entry["compression"])
        session.compressed.on = False  # as the saved run stood at this iteration
        lifecycle.compressor = None
        # compressing or not as the saved run was at its iteration
        session.compressed.restored_at(session.state.iteration, lifecycle)
    saved_runner = entry["runner"]
    if saved_runner is not None:
        session.modes.restore(list(saved_runner["order"]), bool(saved_runner["active"]),
                              bool(saved_runner["recording"]), plan)
    if lifecycle.auto is not None and entry["auto"] is not None:
        lifecycle.auto = dataclasses.replace(AutoState(), **entry["auto"])


def save(session: Session, torch_state: dict[str, Any]) -> dict[str, Any]:
    """`torch_state` (the optimizer's own state_dict()) with the ``commsched`` entry added,
    where there is one (an elastic job before its first step has no plan yet)."""
    entry = capture(session)
    if entry is not None:
        torch_state[KEY] = entry
    return torch_state


def load(session: Session, state_dict: dict[str, Any],
         torch_load: Callable[[dict[str, Any]], None]) -> None:
    """The wrapper's load_state_dict(): pending updates applied, the entry checked before
    torch's state changes (`torch_load`: the optimizer's own load_state_dict), then the run put
    where the entry says."""
    if session.binding.elastic:  # Note [Elastic Horovod and deferred updates] in elastic_guard.py
        session.binding.unbind()
    else:
        session.flush()  # not a pause, as in state_dict()
    session.hook_gradients()  # the restored plan may be another, or not yet settled
    entry = state_dict.get(KEY)
    if entry is not None:
        validate(session, entry)
    torch_load({k: v for k, v in state_dict.items() if k != KEY})
    session.deferred.invalidate()  # torch replaced the state and param-group dicts
    if session.sharded is not None:  # the slices are cut from the loaded state at the next step
        session.sharded.loaded()
    if entry is not None:
        restore(session, entry)
