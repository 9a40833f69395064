"""What an overlap plan means to the overlap runner, worked out once per plan when it is
activated: the tensors some block completes (taken out of ``p.grad`` at step()), each update
group's slots among them, the block it waits for and the all-gathers released before that wait,
which modules' pre-hooks apply which groups, and the tensors in no group."""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ....plan import Plan, Stage, UpdateGroup
from ....plan.pieces import UpdatePiece, group_pieces
from ....plan.update_groups import per_module_groups
from ....sim.overlap import completing_blocks

if TYPE_CHECKING:
    from ...engine.handle import RunningCompressor


@dataclass
class GroupWork:
    """What an update group's call needs, worked out once per plan: its tensors that some block
    completes (as slots: positions in the runner's list of taken tensors), their parameters and
    bytes, the block it waits for, how many of DeAR's all-gathers must be released before that
    wait (`gathers_through`, for the runner's `_release_through`), and its sub-optimizer (with
    the generation of the deferred updates it was made in)."""

    slots: list[int]
    params: list[torch.Tensor]
    nbytes: int
    wait_for: int
    gathers_through: int
    optimizer: torch.optim.Optimizer | None = None
    generation: int = -1
    pieces: tuple[UpdatePiece, ...] = ()  # () where the group is stepped whole


@dataclass(frozen=True)
class PlanLayout:
    """The runner's view of the plan it runs (empty while none is activated)."""

    # Tensor id -> plan position of the block that completes it (sim.overlap.completing_blocks).
    needs: dict[int, int] = field(default_factory=dict)
    # The tensors some block completes (those in `needs`) and their parameters: step() takes
    # their gradients out of p.grad. A tensor's slot is its position in these lists.
    taken_ids: list[int] = field(default_factory=list)
    taken_params: list[torch.Tensor] = field(default_factory=list)
    # Slot -> index in the lossy compressor's gradients (Note [Compression under an overlap
    # plan]), for the slots it rebuilds under this plan.
    decompressed: dict[int, int] = field(default_factory=dict)
    groups: tuple[UpdateGroup, ...] = ()
    # Module name -> the groups its pre-hook may apply: those starting there, and those
    # holding a parameter it is the first user of (Note [Skipped group starts]).
    groups_at: dict[str, list[int]] = field(default_factory=dict)
    # The plan positions of DeAR's all-gathers (blocks of the forward stage).
    gathers: list[int] = field(default_factory=list)
    work: list[GroupWork] = field(default_factory=list)  # by group, as `groups`
    # Whether no tensor is in two groups: a pending group's tensors are then all pending.
    disjoint: bool = False
    # Slots in no group: the runner's finish() applies them (and the root's end-of-forward
    # hook, Note [The end of the forward pass] in overlap/runner.py, exists only while there
    # are some).
    ungrouped: list[int] = field(default_factory=list)


# Note [Skipped group starts]
# A group is applied in the pre-hook of its first module, but control flow may skip that module
# in some iteration (a branch taken on even steps only, an expert that got no tokens) while a
# later module of the same group runs: it would then compute with the old parameters, and the
# update applied at the end of forward would change tensors its backward still needs. So the
# first user of every parameter of a group also applies the group if it is still pending; when
# the start ran, that costs one lookup.
#
# Note [The leading group runs at the root]
# The group that starts at the first module of the forward pass to use any parameter is applied
# in the root module's pre-hook instead: no module before that one reads a parameter, so the
# update still comes before its first use and the forward pass hides no less of its wait; and
# the root runs in every forward pass that ran it in the profiling steps, so that group needs no
# first-user hooks. With one group (a world of one, or nothing to overlap) only the root keeps
# hooks: each hooked module costs a Python call and torch's slow module-call path per forward
# pass (22 modules of the built-in Transformer, about 75 of GPT-2). But `model=` need not be
# what the loop calls: a container whose inner network the loop calls, a LightningModule whose
# training_step calls self.net, an fx GraphModule of the model. Its root then never ran in the
# recorded forward passes (it is not in `order`), and the leading group keeps the hooks of its
# own modules, as every other group does.
def hook_places(groups: Sequence[UpdateGroup], first_user: dict[int, str], order: list[str],
                modules: set[str], root: str) -> dict[str, list[int]]:
    """Module name -> the indices of the groups its forward pre-hook applies when pending: each
    group at its start and at the first user of each of its tensors (`first_user`: tensor id ->
    module), the leading group at the root where the root ran in `order`, and a name not among
    `modules` at the root too."""
    users_now = set(first_user.values())
    leading = next((name for name in order if name in users_now), None) \
        if root in order else None
    places: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        users = {root} if group.module == leading else \
            {group.module, *(first_user.get(t, group.module) for t in group.tensor_ids)}
        for name in sorted(n if n in modules else root for n in users):
            if index not in places.get(name, []):
                places.setdefault(name, []).append(index)
    return places


def outermost(order: list[str], modules: set[str], root: str) -> str:
    """The module whose forward pass ends the recorded ones: the root, unless the loop calls a
    module inside it (Note [The leading group runs at the root]), then the first one called."""
    return root if root in order or not order or order[0] not in modules else order[0]


def runner_of(name: str, ran: Collection[str]) -> str:
    """The module whose pre-hook must apply `name`'s parameters: `name` itself if its forward
    ran, else its nearest ancestor that ran (nn.MultiheadAttention reads
    ``out_proj.weight`` without calling ``out_proj``), else the root."""
    while name and name not in ran:
        name = name.rpartition(".")[0]
    return name


def first_users(order: list[str], owned: dict[str, list[int]]) -> dict[int, str]:
    """Tensor id -> the module (in the observed forward `order`) whose pre-hook applies its
    update; `owned`: module name -> the ids of the tensors it holds directly. A tensor none of
    whose modules ran, the root included, has none."""
    rank = {name: i for i, name in enumerate(order)}
    ran = set(order)
    earliest: dict[int, str] = {}
    for owner, tids in owned.items():
        runner = runner_of(owner, ran)
        if runner not in ran:  # no module of its line ran (nor the root): no hook can apply it
            continue
        for t in tids:
            current = earliest.get(t)
            if current is None or rank.get(runner, -1) < rank.get(current, -1):
                earliest[t] = runner
    return earliest


def plan_layout(plan: Plan, params: list[torch.Tensor], order: list[str],
                owned: dict[str, list[int]], module_names: set[str], root_name: str,
                compressed: RunningCompressor | None) -> PlanLayout:
    """The plan's update groups (one per first-user module when the plan has none) as the
    runner applies them; `compressed`: the lossy compressor while it runs, else None."""
    needs = completing_blocks(plan, compressed.layout.carriers if compressed else None)
    taken_ids = [t for t in range(len(params)) if t in needs]
    taken_params = [params[t] for t in taken_ids]
    slot_of = {t: slot for slot, t in enumerate(taken_ids)}
    decompressed = {} if compressed is None else \
        {slot_of[t]: index for index, t in enumerate(compressed.ids) if t in slot_of}
    users = first_users(order, owned)
    groups = tuple(plan.update_groups or per_module_groups(order, users, needs))
    groups_at = hook_places(groups, users, order, module_names, root_name)
    gathers = [i for i, b in enumerate(plan.blocks) if b.stage is Stage.FORWARD]
    work = [_group_work(group, slot_of, taken_params, gathers) for group in groups]
    if not gathers and compressed is None:
        sizes = [(p.numel(), p.element_size()) for p in params]
        for group, group_work in zip(groups, work, strict=True):
            if all(params[t].is_contiguous() for t in group.tensor_ids):
                group_work.pieces = group_pieces(plan, group.tensor_ids, slot_of, sizes)
    members = [s for w in work for s in w.slots]
    return PlanLayout(needs, taken_ids, taken_params, decompressed, groups, groups_at, gathers,
                      work, disjoint=len(members) == len(set(members)),
                      ungrouped=sorted(set(range(len(taken_ids))) - set(members)))


def leftovers(layout: PlanLayout, slot_done: list[int], group_done: list[int],
              stamp: int) -> list[int]:
    """The slots not applied in the open iteration (stamped `stamp`), in order."""
    if not layout.disjoint:
        return [s for s in range(len(slot_done)) if slot_done[s] != stamp]
    left = [s for index, work in enumerate(layout.work) if group_done[index] != stamp
            for s in work.slots]
    if not left:
        return layout.ungrouped
    return sorted(left + layout.ungrouped)


def _group_work(group: UpdateGroup, slot_of: dict[int, int], taken_params: list[torch.Tensor],
                gathers: list[int]) -> GroupWork:
    slots = [slot_of[t] for t in group.tensor_ids if t in slot_of]
    params = [taken_params[s] for s in slots]
    # The all-gathers up to the one the group waits for (those at or before its position),
    # plus one of look-ahead (the runner's _release_through).
    gathers_through = bisect.bisect_right(gathers, group.wait_for)
    return GroupWork(slots, params, sum(p.numel() * p.element_size() for p in params),
                     group.wait_for, gathers_through)
