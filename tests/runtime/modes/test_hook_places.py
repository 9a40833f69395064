"""Which modules' forward pre-hooks apply which update groups (runtime/modes/overlap/layout.py,
Note [Skipped group starts] and Note [The leading group runs at the root]): a pure function of
the groups, the first users and the forward order, checked without a model."""

from __future__ import annotations

from commsched.plan import UpdateGroup
from commsched.runtime.modes.overlap.layout import hook_places

ORDER = ["", "embed", "blocks.0", "blocks.1", "head"]
MODULES = set(ORDER)


def test_one_group_is_applied_at_the_root_only() -> None:
    group = UpdateGroup("embed", (0, 1, 2, 3), wait_for=3)
    first_user = {0: "embed", 1: "blocks.0", 2: "blocks.1", 3: "head"}
    assert hook_places([group], first_user, ORDER, MODULES, root="") == {"": [0]}


def test_a_later_group_is_checked_at_each_first_user_of_its_tensors() -> None:
    groups = [UpdateGroup("embed", (0, 1), wait_for=5), UpdateGroup("blocks.1", (2, 3), 2)]
    first_user = {0: "embed", 1: "blocks.0", 2: "blocks.1", 3: "head"}
    # The leading group needs no checks; the second starts at blocks.1, and head (the first
    # user of tensor 3) applies it too if control flow skipped blocks.1.
    assert hook_places(groups, first_user, ORDER, MODULES, root="") == {
        "": [0], "blocks.1": [1], "head": [1]}


def test_a_module_not_in_the_model_falls_back_to_the_root() -> None:
    groups = [UpdateGroup("embed", (0,), wait_for=1), UpdateGroup("gone", (1,), wait_for=0)]
    first_user = {0: "embed", 1: "gone"}
    assert hook_places(groups, first_user, ORDER, MODULES, root="") == {"": [0, 1]}


def test_a_root_that_never_ran_leaves_the_leading_group_its_own_hooks() -> None:
    """`model=` a container whose inner network the loop calls: the root is not in the
    recorded order, so its pre-hook would never apply the leading group."""
    order = ["net", "net.embed", "net.head"]
    group = UpdateGroup("net.embed", (0, 1), wait_for=1)
    first_user = {0: "net.embed", 1: "net.head"}
    modules = {"", *order}
    assert hook_places([group], first_user, order, modules, root="") == {
        "net.embed": [0], "net.head": [0]}
