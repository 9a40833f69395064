"""Two planners compared apart from the noise between two candidates
(benchmarks/harness/planner_pair.py)."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.harness.planner_pair import (
    compare_pairs,
    pair_labels,
    paired_ratio,
    planners_on_same_profiles,
)
from benchmarks.harness.prediction_report import pair_lines
from commsched.sim.profile import builtin_path

PROPHET = "commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB"
BYTESCHEDULER = "commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB"


def vgg16_on(alpha_s: float, beta_s_per_byte: float) -> dict:
    doc = copy.deepcopy(json.loads(builtin_path("vgg16").read_text()))
    doc["world_size"] = 2
    doc["collectives"] = {"allreduce": {"alpha_s": alpha_s, "beta_s_per_byte": beta_s_per_byte}}
    return doc


def test_prophet_fills_the_gaps_a_fast_link_leaves_and_equals_bytescheduler_on_a_slow_one() -> None:
    # VGG-16's backward hands over its gradients in steps. On a link that empties between two
    # steps Prophet sends what is ready as one block (fewer start-ups, fewer update calls); on a
    # link that never empties there is no gap to fill and its plan is ByteScheduler's.
    fast = planners_on_same_profiles([vgg16_on(5e-4, 1e-9)], PROPHET, BYTESCHEDULER, None)
    slow = planners_on_same_profiles([vgg16_on(5e-4, 3e-8)], PROPHET, BYTESCHEDULER, None)
    assert fast is not None and slow is not None
    assert fast["identical_plans"] == 0 and fast["predicted_ratios"][0] < 0.999
    assert slow["identical_plans"] == 1 and slow["predicted_ratios"][0] == pytest.approx(1.0)


def test_profiles_without_module_information_are_left_out() -> None:
    doc = vgg16_on(5e-4, 1e-9)
    del doc["modules"]
    for tensor in doc["tensors"]:
        tensor.pop("module", None)
    assert planners_on_same_profiles([doc], PROPHET, BYTESCHEDULER, None) is None


def test_paired_ratio_is_the_median_of_the_per_round_ratios() -> None:
    # Round 2 was a slow phase for bytescheduler only: the ratio of whole-run medians moves with
    # it, the per-round ratios do not.
    rows = [{"name": "a", "median_ms": 100.0, "round_medians_ms": [100.0, 102.0, 98.0]},
            {"name": "b", "median_ms": 100.0, "round_medians_ms": [100.0, 130.0, 98.0]}]
    assert paired_ratio(rows, "a", "b") == pytest.approx(1.0)
    assert paired_ratio(rows, "a", "missing") is None
    rows[1]["round_medians_ms"] = [100.0]
    assert paired_ratio(rows, "a", "b") is None  # not the same rounds


def test_compare_pairs_reports_both_figures_and_needs_both_candidates() -> None:
    rows = [{"name": PROPHET, "median_ms": 103.0, "round_medians_ms": [101.0, 99.0]},
            {"name": BYTESCHEDULER, "median_ms": 100.0, "round_medians_ms": [100.0, 100.0]}]
    pairs = compare_pairs([PROPHET, BYTESCHEDULER, "hvd"], [vgg16_on(5e-4, 3e-8)], rows, None)
    assert len(pairs) == 1
    assert pairs[0]["measured_ratio"] == pytest.approx(1.03)
    assert pairs[0]["paired_ratio"] == pytest.approx(1.0)
    line = pair_lines(pairs)
    assert "prophet against bytescheduler: measured 1.030x" in line
    assert "identical plans on 1" in line
    assert compare_pairs([PROPHET, "hvd"], [], rows, None) == []



def test_the_baseline_at_several_knobs_pairs_with_the_challengers_knobs() -> None:
    small = "commsched:bytescheduler?partition_bytes=1MiB&credit_bytes=2MiB"
    assert pair_labels([BYTESCHEDULER, small, PROPHET, "commsched:auto"], "prophet",
                       "bytescheduler") == (PROPHET, BYTESCHEDULER)
    assert pair_labels([small, PROPHET], "prophet", "bytescheduler") == (PROPHET, small)
    other = "commsched:bytescheduler?partition_bytes=4MiB"
    assert pair_labels([small, other, PROPHET], "prophet", "bytescheduler") is None
    assert pair_labels([PROPHET, "commsched:prophet", BYTESCHEDULER], "prophet",
                       "bytescheduler") is None


def test_a_control_repeats_its_candidate_and_is_measured_against_it() -> None:
    # Note [A control candidate]: the control parses as the candidate it repeats, pairs with no
    # planner, and its distance from the candidate is reported beside the pair.
    from commsched.bench.candidate import CONTROL, is_control, parse_candidate

    control = BYTESCHEDULER + CONTROL
    assert is_control(control) and not is_control(BYTESCHEDULER)
    assert parse_candidate(control) == parse_candidate(BYTESCHEDULER)
    labels = [PROPHET, BYTESCHEDULER, control]
    assert pair_labels(labels, "prophet", "bytescheduler") == (PROPHET, BYTESCHEDULER)
    rows = [{"name": PROPHET, "median_ms": 103.0, "round_medians_ms": [103.0, 103.0, 103.0]},
            {"name": BYTESCHEDULER, "median_ms": 100.0, "round_medians_ms": [100.0, 100.0, 100.0]},
            {"name": control, "median_ms": 102.0, "round_medians_ms": [102.0, 101.0, 102.0]}]
    pairs = compare_pairs(labels, [], rows, None)
    assert [c["label"] for c in pairs[0]["controls"]] == [control]
    assert pairs[0]["controls"][0]["measured_ratio"] == pytest.approx(100 / 102)
    assert pairs[0]["controls"][0]["paired_ratio"] == pytest.approx(100 / 102)
    text = pair_lines(pairs)
    assert "prophet against bytescheduler: measured 1.030x" in text
    assert "bytescheduler against its control (the same candidate run again in this job): " \
        "measured 0.980x" in text
    assert compare_pairs([PROPHET, BYTESCHEDULER], [], rows[:2], None)[0]["controls"] == []
