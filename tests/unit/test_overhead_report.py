"""The overhead report's verdicts: how far a run's rounds can tell a figure from its target
(Note [How far the rounds can tell]), and a report rendered again from its results.json."""

from __future__ import annotations

import json
import pathlib

from commsched.bench import overhead, overhead_report
from commsched.bench.overhead_report import CONTROL


def _row(name: str, rounds: list[float]) -> dict[str, object]:
    return {"candidate": name, "best_median_ms": min(rounds), "round_medians_ms": rounds,
            "vs_plain": min(rounds) / 40.0, "page_faults_per_step": 0.0, "plan": None,
            "update_groups": None, "auto_chose": None}


PLAIN_ROUNDS = [40.0, 41.0, 40.5, 42.0, 40.2, 41.5, 40.8, 43.0, 40.1, 41.2]


def test_a_candidate_slower_in_every_round_by_the_same_factor_reads_one_ratio() -> None:
    steady = overhead_report._best_ratio([1.1 * ms for ms in PLAIN_ROUNDS], [PLAIN_ROUNDS])
    low, high = overhead_report.resampled_range(steady, len(PLAIN_ROUNDS))
    assert abs(low - 1.1) < 1e-9 and abs(high - 1.1) < 1e-9


def test_noisy_rounds_give_a_range_around_the_figure_and_the_same_one_each_time() -> None:
    noisy = [38.0, 47.0, 44.0, 52.0, 41.5, 49.0, 45.0, 39.5, 50.0, 46.0]
    statistic = overhead_report._best_ratio(noisy, [PLAIN_ROUNDS])
    low, high = overhead_report.resampled_range(statistic, len(noisy))
    assert low <= min(noisy) / min(PLAIN_ROUNDS) < high
    assert high - low > 0.02
    assert overhead_report.resampled_range(statistic, len(noisy)) == (low, high)  # seeded


def test_the_verdict_says_when_the_rounds_cannot_tell() -> None:
    plain = _row("plain", PLAIN_ROUNDS)
    clear = _row("horovod", [1.01 * ms for ms in PLAIN_ROUNDS])
    assert overhead_report.verdict(1.01, 1.03, clear, [plain], "best_median_ms") == (
        "met; resampled rounds 1.010-1.010x")
    slow = _row("dear", [1.2 * ms for ms in PLAIN_ROUNDS])
    assert overhead_report.verdict(1.2, 1.05, slow, [plain], "best_median_ms").startswith(
        "MISSED; resampled rounds 1.200-1.200x")
    # Its best round is one lucky round, the others 10-25% slower: met by the figure, which
    # other draws of the same rounds would not repeat.
    lucky = _row("prophet", [40.4] + [1.1 * ms + 5.0 for ms in PLAIN_ROUNDS[1:]])
    said = overhead_report.verdict(1.01, 1.03, lucky, [plain], "best_median_ms")
    assert said.startswith("met; resampled rounds 1.010-") and said.endswith(
        ": the rounds cannot tell"), said
    # Rows without their rounds (reports older than the rounds' keeping): the figure alone.
    bare = {key: value for key, value in clear.items() if key != "round_medians_ms"}
    assert overhead_report.verdict(1.01, 1.03, bare, [plain], "best_median_ms") == "met"


def test_auto_is_drawn_against_the_policy_measured_fastest() -> None:
    rows = [_row("plain", PLAIN_ROUNDS), _row("horovod", [1.05 * ms for ms in PLAIN_ROUNDS]),
            _row("dear", PLAIN_ROUNDS), _row("auto", [1.01 * ms for ms in PLAIN_ROUNDS])]
    line = overhead_report.auto_against_fastest("cnn", rows, "best_median_ms", "per step")
    assert line == ("cnn auto, per step: 1.010x the fastest policy (dear) (target <= 1.02x) "
                    "met; resampled rounds 1.010-1.010x")


def test_render_checks_an_earlier_report_again(tmp_path: pathlib.Path) -> None:
    rows = [_row("plain", PLAIN_ROUNDS), _row(CONTROL, PLAIN_ROUNDS),
            _row("horovod", [1.01 * ms for ms in PLAIN_ROUNDS])]
    meta = {"device": "cpu", "command": "scripts/bench_overhead.sh", "torch": "t",
            "optimizer": "adamw", "rounds": 10, "steps": 10, "round_ms": 60.0, "warmup": 30,
            "threads": 1, "allocator": "a"}
    (tmp_path / "results.json").write_text(json.dumps(
        {"meta": meta, "results": [{"model": "cnn", "steps": 10, "rows": rows,
                                    "targets": ["an older verdict"]}]}), encoding="utf-8")
    assert overhead.main(["--render", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert report["results"][0]["targets"][0] == (
        "cnn horovod: 1.010x (target <= 1.03x) met; resampled rounds 1.010-1.010x")
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "Command: `scripts/bench_overhead.sh`" in readme and "an older verdict" not in readme
    assert (tmp_path / "results.png").stat().st_size > 0
    assert overhead.main(["--render", str(tmp_path / "missing")]) == 2
