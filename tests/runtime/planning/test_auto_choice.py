"""`auto`'s choice between an overlap plan and a synchronous one (Note [Overlap must win by a
margin] in commsched/runtime/planning/auto/trials.py) and its trials of close runners-up (Note
[Measuring the
close calls]): pure, on hand-made rankings."""

from __future__ import annotations

from commsched.config import Policy
from commsched.plan import Block, Collective, Piece, Plan, Stage
from commsched.runtime.planning.auto.state import CHECK_STEPS, UNTIMED_STEPS, AutoState, Verdict
from commsched.runtime.planning.auto.trials import (
    CROSS_FIT_TRIAL_WINDOW,
    OVERLAP_MARGIN,
    SWITCH_MARGIN,
    TIE_WINDOW,
    TRIAL_ROUNDS,
    TRIAL_STEPS,
    TRIAL_WINDOW,
    baselines,
    measured_fastest,
    prefer_synchronous,
    runners_up,
    trial_schedule,
)
from commsched.sim import Ranked


def ranked(*entries: tuple[str, float]) -> list[Ranked]:
    """Candidates that each run a schedule of their own (one block, sized by its place)."""
    return [Ranked(Policy(name), {}, Plan(name, (Block(0, (Piece(0, 0, i + 1),), "float32"),)),
                   seconds) for i, (name, seconds) in enumerate(entries)]


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


# Note [Measuring the close calls]: which runners-up are measured, and which plan stays.

def test_runners_up_are_the_best_of_each_other_policy_within_the_window() -> None:
    candidates = ranked(("bytescheduler", 1.00), ("bytescheduler", 1.01), ("prophet", 1.02),
                        ("prophet", 1.03), ("dear", 1.12), ("horovod", 1.30))
    # horovod, 30% behind, is no close call: it is measured as the synchronous baseline of an
    # overlap leader (Note [An overlap choice is measured against a synchronous one]).
    # Last, prophet's second knob setting, the closest to its own best (Note [Knob settings
    # the simulator cannot order]).
    assert runners_up(candidates, trials=2) == [5, 2, 4, 3]
    assert runners_up(candidates, trials=1) == [5, 2, 3]
    assert runners_up(candidates, trials=0) == []
    assert runners_up(candidates, trials=5) == [5, 2, 4, 3]
    assert runners_up([], trials=2) == []
    synchronous_leader = ranked(("horovod", 1.00), ("bytescheduler", 1.01), ("mgwfbp", 1.30))
    assert runners_up(synchronous_leader, trials=2) == [1]  # mgwfbp: no close call
    only_overlap = ranked(("bytescheduler", 1.00), ("prophet", 1.01))
    assert runners_up(only_overlap, trials=2) == [1]


def test_a_runner_up_predicted_from_another_fit_has_the_wider_window() -> None:
    # Note [A prediction from another fit]: dear's reduce-scatter/all-gather plan against an
    # all-reduce leader (the 3-rank CNN's case: dear 20% behind on paper, measured faster).
    def decoupled(seconds: float) -> Ranked:
        return Ranked(Policy.DEAR, {}, Plan("dear", (
            Block(0, (Piece(0, 0, 9),), "float32", Collective.REDUCE_SCATTER),
            Block(1, (Piece(0, 0, 9),), "float32", Collective.ALL_GATHER, source=0))), seconds)

    # bytescheduler, within the window, is the overlap plan measured beside the synchronous
    # leader (Note [A synchronous choice is measured against an overlap one])
    leader = ranked(("mgwfbp", 1.00), ("horovod", 1.20), ("bytescheduler", 1.10))
    assert runners_up([*leader, decoupled(1.20)], trials=2) == [2, 3]  # horovod: same fit, 20% off
    assert runners_up([*leader, decoupled(1.0 + CROSS_FIT_TRIAL_WINDOW * 1.01)], trials=2) == [2]
    assert runners_up([*leader, decoupled(1.20)], trials=2, cross_fit_window=TRIAL_WINDOW) == [2]
    # and the other way round: dear leads, an all-reduce plan is the other fit
    assert runners_up([decoupled(1.00), *ranked(("mgwfbp", 1.25))], trials=2) == [1]


def test_a_synchronous_choice_is_measured_against_the_best_overlap_plan() -> None:
    # Note [A synchronous choice is measured against an overlap one]: VGG-16's case, every
    # overlap plan predicted outside the windows behind mgwfbp, one of them measured faster.
    far = ranked(("mgwfbp", 1.00), ("horovod", 1.01), ("prophet", 1.40), ("dear", 1.60))
    assert runners_up(far, trials=2) == [1, 2]
    assert runners_up(far, trials=1) == [1, 2]
    assert runners_up(far, trials=0) == []
    # an overlap runner-up within the window is measured anyway: nothing on top
    near = ranked(("mgwfbp", 1.00), ("prophet", 1.10), ("horovod", 1.11), ("dear", 1.60))
    assert runners_up(near, trials=1) == [1]
    # nothing to measure against where no plan overlaps
    assert runners_up(ranked(("mgwfbp", 1.00), ("horovod", 1.40)), trials=2) == []
    # a synchronous baseline of an overlap leader is no reason for another overlap plan
    assert runners_up(ranked(("dear", 1.00), ("mgwfbp", 1.40), ("prophet", 1.50)), trials=2) == [1]


def test_a_runner_up_must_beat_the_leader_by_the_margin() -> None:
    assert measured_fastest({0: 1.0, 2: 1.0 * (1 - SWITCH_MARGIN * 0.5)}, leader=0) == 0
    assert measured_fastest({0: 1.0, 2: 0.95, 4: 0.90}, leader=0) == 4
    assert measured_fastest({0: 1.0}, leader=0) == 0


def test_trial_windows_interleave_the_choice_and_its_runners_up() -> None:
    assert trial_schedule([2, 4], rounds=3) == [2, 4, 0, 2, 4, 0, 2, 4, 0]
    assert trial_schedule([3], rounds=2) == [3, 0, 3, 0]
    assert trial_schedule([], rounds=3) == []


def test_a_policy_planning_a_schedule_already_picked_gives_its_place_to_the_next() -> None:
    # prophet plans bytescheduler's very partitions (unshaped, the Transformer): measuring it
    # would measure one schedule twice, and ddp, next in line, would never be measured.
    blocks = (Block(0, (Piece(0, 0, 1024),), "float32", Collective.ALLREDUCE, Stage.BACKWARD),)
    other = (Block(0, (Piece(0, 0, 512),), "float32"), Block(1, (Piece(0, 512, 512),), "float32"))
    small = {"partition_bytes": 1}
    # The leader sends fewest blocks: no quiet baseline (Note [A quiet backward is measured too]).
    single = (Block(0, (Piece(0, 0, 2048),), "float32"),)
    candidates = [Ranked(Policy.MGWFBP, {}, Plan("mgwfbp", single), 1.00),
                  Ranked(Policy.BYTESCHEDULER, {}, Plan("bytescheduler", blocks), 1.01),
                  Ranked(Policy.BYTESCHEDULER, small, Plan("bytescheduler", other), 1.02),
                  Ranked(Policy.PROPHET, {}, Plan("prophet", blocks), 1.01),
                  Ranked(Policy.PROPHET, small, Plan("prophet", other), 1.02),
                  Ranked(Policy.DDP, {}, Plan("ddp", blocks), 1.05)]
    # ddp runs the same blocks as bytescheduler, but synchronously: another schedule.
    # Last, bytescheduler's other partitions (Note [Knob settings the simulator cannot order]).
    assert runners_up(candidates, trials=2) == [1, 5, 2]
    # The same blocks under another credit are another schedule too.
    candidates[3] = Ranked(Policy.PROPHET, {"credit_bytes": 1}, Plan("prophet", blocks), 1.01)
    assert runners_up(candidates, trials=2) == [1, 3, 2]


def test_the_synchronous_plan_with_fewest_blocks_is_measured_when_close() -> None:
    """Note [A quiet backward is measured too]: the unshaped Transformer's case, ddp's two
    blocks predicted 10% behind, measured fastest."""
    def plan_of(name: str, blocks: int) -> Plan:
        return Plan(name, tuple(Block(b, (Piece(b, 0, 8),), "float32") for b in range(blocks)))

    def candidate(name: str, blocks: int, seconds: float, knobs: dict | None = None) -> Ranked:
        return Ranked(Policy(name), knobs or {}, plan_of(name, blocks), seconds)

    candidates = [candidate("horovod", 24, 1.00), candidate("mgwfbp", 20, 1.01),
                  candidate("ddp", 13, 1.02, {"bucket_bytes": 1}),
                  candidate("ddp", 2, 1.10, {"bucket_bytes": 25})]
    assert baselines(candidates) == [3]
    assert runners_up(candidates, trials=2) == [3, 1]  # one ddp plan: the quiet one
    # far behind, it is no close call
    assert baselines([*candidates[:3], candidate("ddp", 2, 1.0 + 1.01 * CROSS_FIT_TRIAL_WINDOW,
                                                 {"bucket_bytes": 25})]) == []
    # an overlap leader: the best synchronous plan first, then the quiet one
    overlap_first = [candidate("bytescheduler", 30, 0.95), *candidates]
    assert baselines(overlap_first) == [1, 4]
    # the leader is the quiet plan itself: nothing to add
    assert baselines([candidates[3], *candidates[:3]]) == []


def test_one_more_knob_setting_is_measured_where_the_simulator_cannot_order_them() -> None:
    """Note [Knob settings the simulator cannot order]: the shaped Transformer's case,
    bytescheduler 1 MiB predicted 0.6% behind 2 MiB, measured 6% ahead."""
    def candidate(name: str, partition: int, seconds: float) -> Ranked:
        blocks = tuple(Block(b, (Piece(b, 0, 8),), "float32") for b in range(partition))
        return Ranked(Policy(name), {"partition_bytes": partition}, Plan(name, blocks), seconds)

    candidates = [candidate("dear", 4, 0.3037), candidate("dear", 16, 0.3896),
                  candidate("bytescheduler", 2, 0.3377), candidate("prophet", 2, 0.3377),
                  candidate("bytescheduler", 1, 0.3397), candidate("mgwfbp", 5, 0.3743)]
    # the baseline mgwfbp, the runner-up bytescheduler 2 MiB (prophet runs its very schedule:
    # it plans the same blocks under another name), and bytescheduler 1 MiB
    assert runners_up(candidates, trials=2) == [5, 2, 4]
    # dear's next setting is 28% behind: no tie
    assert runners_up(candidates[:2] + candidates[5:], trials=2) == [2]
    # a setting predicted TIE_WINDOW or more behind is left to the ranking
    apart = candidate("bytescheduler", 1, 0.3377 * (1.0 + 1.01 * TIE_WINDOW))
    assert runners_up([*candidates[:4], apart, candidates[5]], trials=2) == [5, 2]
    # only one: the closest tie of any measured policy
    dear_tie = candidate("dear", 16, 0.3037 * 1.001)
    assert runners_up([candidates[0], dear_tie, *candidates[2:]], trials=2) == [5, 2, 1]
    assert runners_up(candidates, trials=0) == []


def _state(*entries: tuple[str, float], trials: int = 2) -> AutoState:
    state = AutoState()
    state.start(ranked(*entries), trials)
    return state


def _fill_window(state: AutoState) -> None:
    """Records 1 s steps until the window is full: its untimed first steps, then its own."""
    said = [state.record(1.0) for _ in range(UNTIMED_STEPS + state.window)]
    assert said == [False] * (len(said) - 1) + [True]


def _run_windows(state: AutoState, seconds_of: dict[str, list[float]]) -> list[Verdict]:
    """Concludes every window with the next figure of the installed plan's policy."""
    verdicts = []
    while state.deciding:
        assert state.chosen is not None
        choice = state.history[-1]["why"] == "choice"
        assert state.window == (CHECK_STEPS if choice else TRIAL_STEPS)
        _fill_window(state)
        verdicts.append(state.conclude(seconds_of[state.chosen.policy.value].pop(0)))
    return verdicts


def test_auto_measures_its_runners_up_interleaved_and_keeps_the_fastest() -> None:
    # The 3-rank CNN's case: dear predicted 12% behind bytescheduler, measured 5% ahead; one
    # slow window of dear's (0.60) does not decide, the median of its windows does. The
    # choice's slow check (0.50, the process still warming up) is not one of its windows.
    state = _state(("bytescheduler", 0.454), ("prophet", 0.456), ("dear", 0.509), ("horovod", 0.60))
    windows = {"bytescheduler": [0.50, 0.462, 0.460, 0.465, 0.459, 0.461, 0.463],
               "prophet": [0.463, 0.466, 0.470, 0.468, 0.467, 0.465],
               "dear": [0.60, 0.441, 0.440, 0.445, 0.442, 0.444], "horovod": [0.50] * 6}
    verdicts = _run_windows(state, windows)
    # The check starts the trials (their plans made again from its window: Note [Trials of
    # steady plans]); every trial window but the last ends in another plan's install; after the
    # last, which ran the choice, dear is installed to stay.
    # horovod, the synchronous baseline, is measured first.
    assert verdicts == [Verdict.TRIALS] + [Verdict.INSTALL] * 4 * TRIAL_ROUNDS
    policies = [h["policy"] for h in state.history]
    assert policies == (["bytescheduler"]
                        + ["horovod", "prophet", "dear", "bytescheduler"] * TRIAL_ROUNDS
                        + ["dear"])
    assert [h["why"] for h in state.history][-1] == "kept"
    assert state.chosen is not None and state.chosen.policy.value == "dear"
    assert not state.deciding and state.measured_s == 0.443
    assert state.history[2]["predicted_s"] == 0.456  # each window carries its own prediction


def test_every_window_leaves_its_first_step_untimed() -> None:
    """Note [A window's first step pays for no traffic]: the step after an install is left out
    of the window, whichever plan it installed, and the window still counts its steps in full."""
    state = _state(("bytescheduler", 0.454), ("horovod", 0.46))
    for window in (CHECK_STEPS, TRIAL_STEPS):
        assert state.record(0.001) is False  # the untimed step, however fast
        timed = [state.record(0.5) for _ in range(window)]
        assert timed == [False] * (window - 1) + [True]
        assert state.local_median() == 0.5 and 0.001 not in state.periods
        state.conclude(0.5)
    assert state.windows == {1: [0.5]}  # the check, then horovod's first trial window


def test_the_choices_check_is_not_one_of_its_trial_windows() -> None:
    # mgwfbp's check ran slow (warm-up); its trial windows, like prophet's, are what count.
    state = _state(("mgwfbp", 0.276), ("prophet", 0.274))
    # Counted, the check would make mgwfbp's median 0.300 and prophet 3% faster.
    windows = {"mgwfbp": [0.330, 0.280, 0.300, 0.281, 0.300, 0.281, 0.300],
               "prophet": [0.290] * 6}
    verdicts = _run_windows(state, windows)
    assert verdicts[-1] is Verdict.KEEP  # the last window ran mgwfbp, which stays
    assert state.chosen is not None and state.chosen.policy.value == "mgwfbp"
    assert state.measured_s == 0.2905


def test_auto_keeps_its_choice_when_no_runner_up_beats_it_by_the_margin() -> None:
    state = _state(("dear", 0.30), ("bytescheduler", 0.31), ("horovod", 0.33))
    windows = {"dear": [0.300, 0.310, 0.305, 0.300, 0.306, 0.304, 0.306],
               "bytescheduler": [0.301, 0.304, 0.303, 0.302, 0.304, 0.303],  # 0.8% ahead
               "horovod": [0.29, 0.33, 0.33, 0.33, 0.33, 0.33]}
    verdicts = _run_windows(state, windows)
    assert state.chosen is not None and state.chosen.policy.value == "dear"
    assert verdicts[-1] is Verdict.KEEP  # the last window ran dear
    assert not state.deciding and state.measured_s == 0.3055
    assert state.record(0.1) is False  # nothing more to measure


def test_a_prediction_far_off_is_re_planned_before_any_trial() -> None:
    state = _state(("dear", 0.30), ("bytescheduler", 0.31))
    assert state.conclude(0.40) is Verdict.REPLAN and state.replanned
    state = _state(("horovod", 0.30), ("mgwfbp", 0.31), trials=0)
    assert state.conclude(0.30) is Verdict.KEEP and not state.deciding  # the prediction decides
    state = _state(("horovod", 0.30), ("mgwfbp", 0.40))  # no runner-up within the window
    assert state.conclude(0.30) is Verdict.KEEP and not state.deciding


def test_after_a_re_plan_the_new_choice_is_checked_once_and_its_runners_up_measured() -> None:
    state = _state(("dear", 0.30), ("bytescheduler", 0.31))
    assert state.conclude(0.40) is Verdict.REPLAN
    # The re-plan's ranking (from the new profile): no second re-plan, however far off.
    state.start(ranked(("horovod", 0.40), ("mgwfbp", 0.41)), trials=2)
    verdicts = _run_windows(state, {"horovod": [0.60] + [0.40] * 6, "mgwfbp": [0.35] * 6})
    assert verdicts[0] is Verdict.TRIALS and state.replanned
    assert state.chosen is not None and state.chosen.policy.value == "mgwfbp"
    assert verdicts[-1] is Verdict.INSTALL and state.measured_s == 0.35


def test_a_state_restored_from_a_checkpoint_keeps_its_plan() -> None:
    # What a checkpoint taken during a trial window saves (runtime/checkpoint_entry.py); the ranking
    # is not saved, so the plan the checkpoint holds stays.
    state = AutoState(predicted_s=0.30, history=[
        {"policy": "dear", "knobs": {}, "predicted_s": 0.30, "measured_s": None, "why": "trial"}])
    assert state.deciding
    assert state.conclude(0.50) is Verdict.KEEP and not state.deciding


def test_auto_is_settled_once_its_kept_plan_is_planned_again() -> None:
    """Note [Planning from the steady state]: the plan kept is rebuilt once from its own
    iterations; a benchmark times `auto` only after that."""
    state = _state(("bytescheduler", 0.454), ("horovod", 0.60), trials=0)
    _run_windows(state, {"bytescheduler": [0.46]})
    assert not state.deciding and state.settled
    state.refining = True  # the lifecycle schedules the re-plan
    assert not state.settled
    kept = state.chosen
    assert kept is not None
    again = Plan("bytescheduler", ())
    state.refine(again)
    assert state.settled and state.refined and state.chosen is not None
    assert state.chosen.plan is again and state.chosen.policy == kept.policy
    assert state.chosen.knobs == kept.knobs and state.measured_s == 0.46


def test_the_trials_measure_plans_made_again_from_the_choices_window() -> None:
    """Note [Trials of steady plans]: when the trials start, the choice and every runner-up to
    measure (not the candidates left out) get the plan the lifecycle made again for them."""
    state = _state(("bytescheduler", 0.454), ("prophet", 0.456), ("dear", 0.509),
                   ("horovod", 0.90), ("mgwfbp", 0.95))
    _fill_window(state)
    assert state.conclude(0.46) is Verdict.TRIALS
    assert state.trial_candidates() == [0, 1, 2, 3]  # mgwfbp is not a close call
    again = {index: Plan(state.choices[index].policy.value, ()) for index in (0, 1, 2, 3)}
    left_out = state.choices[4].plan
    state.replan_trials(again)
    assert [c.plan for c in state.choices[:4]] == [again[i] for i in range(4)]
    assert state.choices[4].plan is left_out
    assert state.chosen is not None and state.chosen.plan is again[3]  # the baseline first
