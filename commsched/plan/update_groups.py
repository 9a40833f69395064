"""Update groups: which parameters one call of the user's optimizer updates, under an overlap plan.

Under cross-iteration overlap a parameter's update runs in the next forward pass: after the block
that completes its gradient, before the first module that uses it. Each call of the user's
optimizer costs a fixed amount (its kernel launches and the Python around them) plus a cost per
byte. Few calls keep the fixed cost low; more calls let the forward pass start while later blocks
are still on the wire. The planner trades the two from the profile.

A group is a run of consecutive "user" modules in forward order (modules that are the first user
of some parameter); it is applied in the forward pre-hook of its first module and waits for the
latest block among its parameters. With modules in forward order, T(i) the forward time before
module i runs (no waits), D(j, k) the latest completion time (from the start of the forward
pass) of the parameters of user modules j..k-1, and B(j, k) their bytes:

    arrive[0] = T(u_0)
    arrive[k] = min over j < k of   max(arrive[j], D(j, k)) + fixed + per_byte * B(j, k)
                                    + T(u_k) - T(u_j)

arrive[k] is the earliest time the pre-hook of user module u_k can be reached with every
earlier group applied (u_K is the end of the forward pass). Reaching a boundary earlier is never
worse, so this dynamic program finds the fastest grouping for the model; among equally fast
ones it takes the fewest groups. With nothing measured, each user module is its own group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .types import UpdateGroup

# Two groupings whose predicted forward passes differ by less than this are equally fast.
TIE_S = 1e-9


@dataclass(frozen=True)
class UpdateCost:
    """One call of the user's optimizer: fixed_s + per_byte_s * bytes."""

    fixed_s: float = 0.0
    per_byte_s: float = 0.0

    def time(self, nbytes: int) -> float:
        return self.fixed_s + self.per_byte_s * nbytes


def _user_modules(order: Sequence[str], first_user: Mapping[int, str]) -> list[str]:
    """User modules in forward order; a module not in `order` comes first (the root applies
    what no module that ran claimed)."""
    used = set(first_user.values())
    known = [m for m in order if m in used]
    unknown = sorted(used - set(order))
    return unknown + known


def per_module_groups(order: Sequence[str], first_user: Mapping[int, str],
                      needs: Mapping[int, int]) -> tuple[UpdateGroup, ...]:
    """One group per user module: the grouping when nothing is measured."""
    groups = []
    for module in _user_modules(order, first_user):
        tids = tuple(sorted(t for t, m in first_user.items() if m == module and t in needs))
        if tids:
            groups.append(UpdateGroup(module, tids, max(needs[t] for t in tids)))
    return tuple(groups)


def plan_update_groups(modules: Sequence[tuple[str, float]], first_user: Mapping[int, str],
                       needs: Mapping[int, int], done_at: Mapping[int, float],
                       nbytes: Mapping[int, int], cost: UpdateCost) -> tuple[UpdateGroup, ...]:
    """The fastest grouping (see the module docstring).

    modules:    forward order, each with its own forward seconds
    first_user: tensor id -> the module whose pre-hook must apply its update
    needs:      tensor id -> plan position of the block that completes its gradient (tensors
                without one are not updated by the overlap runner and are left out)
    done_at:    tensor id -> predicted completion of that block, seconds from forward start
    """
    order = [name for name, _ in modules]
    users = _user_modules(order, first_user)
    if not users:
        return ()
    start: dict[str, float] = {}
    clock = 0.0
    for name, seconds in modules:
        start.setdefault(name, clock)
        clock += seconds
    end_of_forward = clock
    at = [start.get(m, 0.0) for m in users] + [end_of_forward]
    members = [[t for t in sorted(first_user) if first_user[t] == m and t in needs] for m in users]
    count = len(users)
    # best[k] = (arrival time at boundary k, groups so far, start of the last group)
    best: list[tuple[float, int, int]] = [(at[0], 0, -1)] + [(float("inf"), 0, -1)] * count
    for k in range(1, count + 1):
        latest, size = 0.0, 0
        for j in range(k - 1, -1, -1):  # the group holds user modules j..k-1
            latest = max([latest] + [done_at.get(t, 0.0) for t in members[j]])
            size += sum(nbytes.get(t, 0) for t in members[j])
            arrive, calls, _ = best[j]
            if arrive == float("inf"):
                continue
            t = max(arrive, latest) + cost.time(size) + at[k] - at[j]
            best_t, best_calls, _ = best[k]
            if t < best_t - TIE_S or (t <= best_t + TIE_S and calls + 1 < best_calls):
                best[k] = (t, calls + 1, j)
    bounds = []
    k = count
    while k > 0:
        j = best[k][2]
        bounds.append((j, k))
        k = j
    groups = []
    for j, k in reversed(bounds):
        tids = tuple(sorted(t for m in range(j, k) for t in members[m]))
        if tids:
            groups.append(UpdateGroup(users[j], tids, max(needs[t] for t in tids)))
    return tuple(groups)
