"""`auto`'s choice between an overlap plan and a synchronous one (Note [Overlap must win by a
margin] in commsched/runtime/auto.py): pure, on hand-made rankings."""

from __future__ import annotations

from commsched.config import Policy
from commsched.plan import Plan
from commsched.runtime.auto import OVERLAP_MARGIN, prefer_synchronous
from commsched.sim import Ranked


def ranked(*entries: tuple[str, float]) -> list[Ranked]:
    return [Ranked(Policy(name), {}, Plan(name, ()), seconds) for name, seconds in entries]


def names(candidates: list[Ranked]) -> list[str]:
    return [r.policy.value for r in candidates]


def test_an_overlap_plan_predicted_only_slightly_faster_gives_way_to_the_best_synchronous() -> None:
    # prophet 2.7% ahead of horovod (the unshaped CNN's case): horovod is installed.
    order = prefer_synchronous(ranked(("prophet", 0.0297), ("dear", 0.0300),
                                      ("horovod", 0.0305), ("ddp", 0.0348)))
    assert names(order) == ["horovod", "prophet", "dear", "ddp"]


def test_an_overlap_plan_well_ahead_keeps_its_place() -> None:
    # dear 15% ahead of the best synchronous plan (a shaped link): nothing moves.
    candidates = ranked(("dear", 0.2145), ("bytescheduler", 0.2189), ("mgwfbp", 0.2470))
    assert prefer_synchronous(candidates) == candidates


def test_the_margin_is_the_boundary() -> None:
    just_inside = ranked(("dear", 1.0), ("horovod", 1.0 + OVERLAP_MARGIN * 0.99))
    just_outside = ranked(("dear", 1.0), ("horovod", 1.0 + OVERLAP_MARGIN * 1.01))
    assert names(prefer_synchronous(just_inside))[0] == "horovod"
    assert names(prefer_synchronous(just_outside))[0] == "dear"


def test_rankings_without_a_choice_between_modes_are_left_alone() -> None:
    sync_first = ranked(("horovod", 1.0), ("dear", 0.99))  # not sorted: the caller's order rules
    only_overlap = ranked(("dear", 1.0), ("prophet", 1.01))
    assert prefer_synchronous(sync_first) == sync_first
    assert prefer_synchronous(only_overlap) == only_overlap
    assert prefer_synchronous([]) == []
