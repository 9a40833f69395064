"""The `auto` policy on 2 Gloo ranks: every rank installs the same simulated-fastest plan, the
prediction is compared with the measured median after 20 steps, close runners-up are measured
and the measured-fastest stays, and training, trials included, equals a single-process
reference that averages both ranks' gradients."""

from __future__ import annotations

import statistics

import pytest
import torch
from helpers import distributed_test
from torch import nn

from commsched.runtime.planning.auto.state import CHECK_STEPS, UNTIMED_STEPS
from commsched.runtime.planning.auto.trials import (
    CROSS_FIT_TRIAL_WINDOW,
    OVERLAP_MARGIN,
    TIE_WINDOW,
    TRIAL_ROUNDS,
    TRIAL_STEPS,
    TRIAL_WINDOW,
    measured_fastest,
)

pytestmark = pytest.mark.processes

# Profiling, the re-plan step, the measured windows (the choice, the one re-plan's choice, and
# the interleaved trial windows of two runners-up, two synchronous baselines and a knob
# setting's twin), each after its untimed first step, and a few more.
STEPS = (3 + 1 + 2 * (UNTIMED_STEPS + CHECK_STEPS)
         + 6 * TRIAL_ROUNDS * (UNTIMED_STEPS + TRIAL_STEPS) + 2)


def _model() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 3))


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(6, 12, generator=torch.Generator().manual_seed(1000 * rank + step))


def _reference(world: int) -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        (sum(model(_batch(step, r)).square().mean() for r in range(world)) / world).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _auto_job(with_model: bool) -> dict:
    import commsched

    rank = commsched.init().rank
    model = _model()
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         model=model if with_model else None, policy="auto",
                                         profile_steps=3)
    for step in range(STEPS):
        opt.zero_grad()
        model(_batch(step, rank)).square().mean().backward()
        opt.step()
    opt.flush()
    assert opt.auto is not None  # policy 'auto' keeps its state
    return {"summary": opt.auto.summary(), "fingerprint": opt.plan.fingerprint,
            "params": [p.detach().clone() for p in model.parameters()]}


def test_auto_installs_one_plan_everywhere_and_trains_like_the_reference() -> None:
    expected = _reference(2)
    for with_model in (True, False):
        results = distributed_test(_auto_job, world_size=2, timeout=120, args=(with_model,))
        first, second = results[0], results[1]
        assert first["fingerprint"] == second["fingerprint"]
        summary = first["summary"]
        assert summary["policy"] == second["summary"]["policy"]
        ranked = [policy for policy, _, _ in summary["ranking"]]
        assert summary["predicted_s"] > 0 and summary["measured_s"] is not None
        history = summary["history"]
        first_choice = history[0]
        assert first_choice["why"] == "choice" and first_choice["measured_s"] > 0
        predicted = first_choice["predicted_s"]
        error = abs(first_choice["measured_s"] - predicted) / predicted
        assert summary["replanned"] == (error > 0.2)  # the one re-plan, exactly when 20% off
        choices = [i for i, h in enumerate(history) if h["why"] == "choice"]
        assert len(choices) == (2 if summary["replanned"] else 1)
        last = history[choices[-1]:]  # the last choice, its trial windows, the plan that stays
        assert last[0]["policy"] == ranked[0]
        plans: dict[str, list[float]] = {}  # each plan's trial window medians, the choice's first
        for window in last:
            if window["why"] == "trial" or window is last[0]:
                assert window["measured_s"] > 0
                plan = f"{window['policy']} {window['knobs']}"
                plans.setdefault(plan, []).append(window["measured_s"])
        choice = f"{last[0]['policy']} {last[0]['knobs']}"
        runners = [plan for plan in plans if plan != choice]
        overlap = {"bytescheduler", "prophet", "dear"}
        # Another policy each; an overlap choice is measured against the best synchronous
        # candidate too, first and however far behind (Note [An overlap choice is measured
        # against a synchronous one]), and a quiet synchronous plan may come next (Note [A
        # quiet backward is measured too]): the baselines, on top of the two runners-up, and
        # one more knob setting of a policy measured (Note [Knob settings the simulator cannot
        # order]).
        baseline = 1 if last[0]["policy"] in overlap and len(last) > 1 else 0
        if baseline:
            best_sync = next(name for name in ranked if name not in overlap)
            assert last[1]["policy"] == best_sync and last[1]["why"] == "trial"
        assert len(runners) == len(plans) - 1 <= 4 + baseline
        predicted = {(h["policy"], str(h["knobs"])): h["predicted_s"] for h in last}
        far = set()  # plans measured that are no close call (dear's collectives: the other fit's)
        for window in last[1:]:
            key = (window["policy"], str(window["knobs"]))
            if any(policy == key[0] and knobs != key[1]
                   and seconds <= predicted[key] <= seconds * (1 + TIE_WINDOW)
                   for (policy, knobs), seconds in predicted.items()):
                continue  # a twin: its policy's other setting is measured, as close as a tie
            other_fit = (window["policy"] == "dear") != (last[0]["policy"] == "dear")
            allowed = CROSS_FIT_TRIAL_WINDOW if other_fit else TRIAL_WINDOW
            if window["predicted_s"] > last[0]["predicted_s"] * (1 + allowed):
                far.add((window["policy"], str(window["knobs"])))
        # Only a baseline may be measured however far behind (the Notes above): at most the two
        # synchronous ones, and the best-ranked overlap plan beside a synchronous choice (Note
        # [A synchronous choice is measured against an overlap one]).
        far_overlap = {policy for policy, _ in far} & overlap
        best_overlap = next((name for name in ranked if name in overlap), None)
        assert len(far - {(p, k) for p, k in far if p in overlap}) <= 2
        assert not far_overlap or (last[0]["policy"] not in overlap
                                   and far_overlap == {best_overlap})
        if runners:  # the choice's check is not one of its trial windows
            assert last[-1]["why"] == "kept"
            assert f"{last[-2]['policy']} {last[-2]['knobs']}" == choice
            plans[choice] = plans[choice][1:]
            assert all(len(medians) == TRIAL_ROUNDS for medians in plans.values())
        names = list(plans)
        kept = names[measured_fastest({i: statistics.median(plans[n]) for i, n in enumerate(names)},
                                      leader=0)]
        assert f"{summary['policy']} {summary['knobs']}" == kept
        predictions = [t for _, _, t in summary["ranking"]]
        # Fastest prediction first, except that the best synchronous plan goes first when the
        # fastest (an overlap plan) wins by less than the margin (Note [Overlap must win by a
        # margin]).
        assert predictions[1:] == sorted(predictions[1:])
        if predictions[0] > predictions[1]:
            assert ranked[0] not in overlap and ranked[1] in overlap
            assert predictions[0] <= predictions[1] * (1 + OVERLAP_MARGIN)
        if with_model:
            assert overlap <= set(ranked)
        else:
            assert not overlap & set(ranked)  # no model=: only synchronous plans are valid
        for rank_result in (first, second):
            for got, want in zip(rank_result["params"], expected, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
