"""Update groups of overlap plans: hand-worked cases and a brute-force check of the DP."""

from __future__ import annotations

import itertools
import random

from commsched.plan import UpdateGroup
from commsched.plan.update_groups import UpdateCost, per_module_groups, plan_update_groups

MODULES = [("", 0.0), ("a", 1.0), ("b", 1.0), ("c", 1.0)]
FIRST_USER = {0: "a", 1: "b", 2: "c"}
NEEDS = {0: 0, 1: 1, 2: 2}
BYTES = {0: 100, 1: 100, 2: 100}


def test_everything_arrived_before_the_forward_pass_is_one_call() -> None:
    groups = plan_update_groups(MODULES, FIRST_USER, NEEDS, {0: 0.0, 1: 0.0, 2: 0.0}, BYTES,
                                UpdateCost(fixed_s=0.1))
    assert groups == (UpdateGroup("a", (0, 1, 2), 2),)


def test_a_late_block_splits_off_when_waiting_costs_more_than_a_call() -> None:
    # One group waits at a for t2 (1.5 s): 1.5 + 0.1 + 3 = 4.6. Split before c: a applies t0,
    # t1 at 0.1, the forward reaches c at 2.1 > 1.5, c applies t2: 2.1 + 0.1 + 1 = 3.2. Three
    # groups cost one more call: 3.3.
    groups = plan_update_groups(MODULES, FIRST_USER, NEEDS, {0: 0.0, 1: 0.0, 2: 1.5}, BYTES,
                                UpdateCost(fixed_s=0.1))
    assert groups == (UpdateGroup("a", (0, 1), 1), UpdateGroup("c", (2,), 2))


def test_a_call_dearer_than_the_wait_keeps_one_group() -> None:
    # One group: 1.5 + 5 + 3 = 9.5; split before c: 5 + 2 = 7, then 7 + 5 + 1 = 13.
    groups = plan_update_groups(MODULES, FIRST_USER, NEEDS, {0: 0.0, 1: 0.0, 2: 1.5}, BYTES,
                                UpdateCost(fixed_s=5.0))
    assert groups == (UpdateGroup("a", (0, 1, 2), 2),)


def test_per_byte_cost_counts_and_unclaimed_tensors_go_first() -> None:
    first_user = {**FIRST_USER, 3: "gone"}  # a module that did not run: applied at the start
    groups = per_module_groups([m for m, _ in MODULES], first_user, {**NEEDS, 3: 0})
    assert [g.module for g in groups] == ["gone", "a", "b", "c"]
    assert groups[0] == UpdateGroup("gone", (3,), 0)
    # Tensors without a completing block (a world of one runs no collective for them) are not
    # the runner's: they are left out.
    assert per_module_groups(["", "a"], {0: "a", 1: "a"}, {1: 4}) == (UpdateGroup("a", (1,), 4),)


def _forward_time(groups: list[list[int]], modules: list[tuple[str, float]], users: list[str],
                  members: list[list[int]], done: dict[int, float], nbytes: dict[int, int],
                  cost: UpdateCost) -> float:
    """Walks the forward pass as the simulator does: a group's call at its first module."""
    first_of = {users[g[0]]: g for g in groups}
    t = 0.0
    for name, seconds in modules:
        group = first_of.get(name)
        if group is not None:
            tids = [x for m in group for x in members[m]]
            t = max([t] + [done[x] for x in tids]) + cost.time(sum(nbytes[x] for x in tids))
        t += seconds
    return t


def test_the_program_finds_the_fastest_grouping_of_random_cases() -> None:
    rng = random.Random(7)
    for _ in range(60):
        count = rng.randint(1, 6)
        modules = [("", rng.choice([0.0, 0.2]))] + [(f"m{i}", rng.uniform(0.1, 2.0))
                                                    for i in range(count)]
        first_user = {t: f"m{rng.randrange(count)}" for t in range(rng.randint(1, 8))}
        needs = {t: t for t in first_user}
        done = {t: rng.uniform(0.0, 6.0) for t in first_user}
        nbytes = {t: rng.randint(1, 1000) for t in first_user}
        cost = UpdateCost(rng.uniform(0.0, 1.0), rng.uniform(0.0, 1e-3))
        groups = plan_update_groups(modules, first_user, needs, done, nbytes, cost)
        users = [m for m, _ in modules if m in set(first_user.values())]
        members = [[t for t in sorted(first_user) if first_user[t] == m] for m in users]
        index = {m: i for i, m in enumerate(users)}
        chosen = [[index[first_user[t]] for t in g.tensor_ids] for g in groups]
        chosen = [sorted(set(c)) for c in chosen]
        assert sorted(t for g in groups for t in g.tensor_ids) == sorted(first_user)
        assert all(g.wait_for == max(needs[t] for t in g.tensor_ids) for g in groups)
        best = min(
            _forward_time([list(range(a, b)) for a, b in zip((0, *cuts), (*cuts, len(users)),
                                                             strict=True)],
                          modules, users, members, done, nbytes, cost)
            for r in range(len(users))
            for cuts in itertools.combinations(range(1, len(users)), r))
        ours = _forward_time(chosen, modules, users, members, done, nbytes, cost)
        assert abs(ours - best) < 1e-9, (groups, ours, best)
