"""The overhead report's verdicts: the interval each figure covers over its run's rounds
resampled (Note [The range of a best round]), and a report rendered again from its
results.json."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks.harness import overhead, overhead_report, resample
from benchmarks.harness.overhead_report import CONTROL

PLAIN_ROUNDS = [40.0, 41.0, 40.5, 42.0, 40.2, 41.5, 40.8, 43.0, 40.1, 41.2]


def _row(name: str, rounds: list[float], free: list[float] | None = None) -> dict[str, object]:
    row: dict[str, object] = {
        "candidate": name, "best_median_ms": min(rounds), "round_medians_ms": rounds,
        "vs_plain": min(rounds) / min(PLAIN_ROUNDS), "page_faults_per_step": 0.0, "plan": None,
        "update_groups": None, "auto_chose": None}
    if free is not None:
        row.update(free_best_median_ms=min(free), free_round_medians_ms=free,
                   free_vs_plain=min(free) / min(PLAIN_ROUNDS))
    return row


def _scaled(factor: float) -> list[float]:
    return [factor * ms for ms in PLAIN_ROUNDS]


def _target_line(rows: list[dict[str, object]], name: str, device: str = "cpu",
                 model: str = "cnn") -> str:
    return next(line for line in overhead_report.targets(model, device, rows)
                if line.startswith(f"{model} {name}:"))


def _fastest_lines(rows: list[dict[str, object]], model: str = "cnn",
                   device: str = "cpu") -> list[str]:
    return [line for line in overhead_report.targets(model, device, rows) if "fastest" in line]


def test_a_candidate_slower_in_every_round_by_one_factor_reads_that_factor_throughout() -> None:
    rows = [_row("plain", PLAIN_ROUNDS), _row("horovod", _scaled(1.01)),
            _row("dear", _scaled(1.2))]
    assert _target_line(rows, "horovod") == (
        "cnn horovod: 1.010x (target <= 1.03x) met; 90% of resampled rounds 1.010-1.010x")
    assert _target_line(rows, "dear") == (
        "cnn dear: 1.200x (target <= 1.03x) MISSED; 90% of resampled rounds 1.200-1.200x")


def test_a_figure_from_one_lucky_round_is_one_the_rounds_cannot_tell() -> None:
    # Its best round is one lucky round, the others 10-25% slower: met by the figure, which
    # other draws of the same rounds would not repeat.
    lucky = [40.4] + [1.1 * ms + 5.0 for ms in PLAIN_ROUNDS[1:]]
    line = _target_line([_row("plain", PLAIN_ROUNDS), _row("prophet", lucky)], "prophet")
    low, high = (float(x) for x in line.split("rounds ")[1].split("x")[0].split("-"))
    assert line.startswith("cnn prophet: 1.010x (target <= 1.03x) met; 90% of resampled rounds")
    assert line.endswith(": the rounds cannot tell")
    assert low <= 1.010 <= high and high > 1.03


def test_a_miss_the_rounds_settle_says_so() -> None:
    noisy = [50.0, 44.0, 46.5, 45.0, 47.0, 44.5, 48.0, 45.5, 44.2, 46.0]  # 1.10x or more
    line = _target_line([_row("plain", PLAIN_ROUNDS), _row("ddp", noisy)], "ddp")
    assert line.startswith("cnn ddp: 1.100x (target <= 1.03x) MISSED; 90% of resampled rounds")
    assert "cannot tell" not in line


def test_the_interval_is_the_middle_ninety_percent_of_the_draws() -> None:
    # A statistic that counts its calls: draw k gives k, so the interval's ends are the ranks.
    calls = iter(range(10_000))
    values = resample.resampled({"a": [1.0, 2.0]}, lambda best: float(next(calls)), summary=min)
    assert len(values) == 2000 and resample.interval(values) == (100.0, 1899.0)


def test_auto_is_held_to_the_fastest_policy_of_each_draw() -> None:
    # horovod is measured fastest by one lucky round; dear is steady just above it. Draws
    # without that round hold auto to dear, as a run without it would have: the interval's low
    # end is auto against dear (1.010x), not against horovod's other rounds (0.918x).
    horovod = [39.0] + [44.0] * 9
    rows = [_row("plain", PLAIN_ROUNDS), _row("horovod", horovod), _row("dear", [40.0] * 10),
            _row("auto", [40.4] * 10)]
    line = overhead_report.auto_against_fastest("cnn", rows, "best_median_ms", "per step")
    assert line == ("cnn auto, per step: 1.036x the fastest policy (horovod) (target <= 1.02x) "
                    "MISSED; 90% of resampled rounds 1.010-1.036x: the rounds cannot tell")


def test_the_control_is_held_to_autos_figure_beside_it() -> None:
    # Note [What no commsched code reads against the fastest policy]: the control, slower in
    # every round by one factor, reads that factor against the fastest policy, next to auto.
    rows = [_row("plain", PLAIN_ROUNDS), _row(CONTROL, _scaled(1.025)),
            _row("horovod", _scaled(1.0)), _row("auto", _scaled(1.01))]
    assert _fastest_lines(rows) == [
        "cnn auto, per step: 1.010x the fastest policy (horovod) (target <= 1.02x) met; "
        "90% of resampled rounds 1.010-1.010x",
        "cnn control against the fastest policy, per step: 1.025x (what a candidate running no "
        "commsched code reads by auto's figure; 90% of resampled rounds 1.025-1.025x)"]
    without_auto = [row for row in rows if row["candidate"] != "auto"]
    assert _fastest_lines(without_auto) == []


def test_the_free_running_clock_is_resampled_from_its_own_rounds() -> None:
    rows = [_row("plain", PLAIN_ROUNDS, free=PLAIN_ROUNDS),
            _row("horovod", _scaled(1.0), free=_scaled(1.0)),
            _row("auto", _scaled(1.0), free=_scaled(1.3))]
    assert _fastest_lines(rows, "gpt2", "cuda") == [
        "gpt2 auto, synchronised per step: 1.000x the fastest policy (horovod) (target <= 1.02x) "
        "met; 90% of resampled rounds 1.000-1.000x",
        "gpt2 auto, free-running: 1.300x the fastest policy (horovod) (target <= 1.02x) "
        "MISSED; 90% of resampled rounds 1.300-1.300x"]


@pytest.mark.parametrize("drop", ["candidate", "reference", "shorter"])
def test_rows_without_the_same_rounds_give_the_figure_alone(drop: str) -> None:
    plain, horovod = _row("plain", PLAIN_ROUNDS), _row("horovod", _scaled(1.01))
    if drop == "candidate":
        del horovod["round_medians_ms"]
    elif drop == "reference":
        del plain["round_medians_ms"]
    else:
        horovod["round_medians_ms"] = _scaled(1.01)[:5]
    assert _target_line([plain, horovod], "horovod") == (
        "cnn horovod: 1.010x (target <= 1.03x) met")


def test_render_checks_an_earlier_report_again(tmp_path: pathlib.Path) -> None:
    rows = [_row("plain", PLAIN_ROUNDS), _row(CONTROL, PLAIN_ROUNDS),
            _row("horovod", _scaled(1.01))]
    meta = {"device": "cpu", "command": "scripts/bench_overhead.sh", "torch": "t",
            "optimizer": "adamw", "rounds": 10, "steps": 10, "round_ms": 60.0, "warmup": 30,
            "threads": 1, "allocator": "a"}
    (tmp_path / "results.json").write_text(json.dumps(
        {"meta": meta, "results": [{"model": "cnn", "steps": 10, "rows": rows,
                                    "targets": ["an older verdict"]}]}), encoding="utf-8")
    assert overhead.main(["--render", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert report["results"][0]["targets"][0] == (
        "cnn horovod: 1.010x (target <= 1.03x) met; 90% of resampled rounds 1.010-1.010x")
    assert report["results"][0]["rows"] == rows  # the measured figures stay as they were
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "Command: `scripts/bench_overhead.sh`" in readme and "an older verdict" not in readme
    assert (tmp_path / "results.png").stat().st_size > 0


def test_render_refuses_what_is_no_report(tmp_path: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert overhead.main(["--render", str(tmp_path / "missing")]) == 2
    (tmp_path / "results.json").write_text('{"meta": {}}', encoding="utf-8")
    assert overhead.main(["--render", str(tmp_path)]) == 2
    assert "is no overhead report (KeyError" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        overhead.main(["--render", str(tmp_path), "--out", str(tmp_path / "elsewhere")])


def test_the_noise_line_gives_the_controls_interval_on_each_clock() -> None:
    rows = [_row("plain", PLAIN_ROUNDS, free=PLAIN_ROUNDS),
            _row(CONTROL, _scaled(1.02), free=_scaled(0.97)), _row("horovod", PLAIN_ROUNDS)]
    assert overhead_report.targets("gpt2", "cuda", rows)[-1] == (
        "gpt2 noise: the control, a second plain optimizer (ideally 1.000x), read 1.020x "
        "synchronised per step (90% of resampled rounds 1.020-1.020x), 0.970x free-running "
        "(90% of resampled rounds 0.970-0.970x)")


def test_a_build_whose_copy_was_slower_widens_the_interval(tmp_path: pathlib.Path) -> None:
    # Two builds of five rounds: horovod's first copy ran as fast as plain, its second 5%
    # slower in every round. The figure (its best round) is 1.000x either way; drawn by build
    # (Note [Resampling builds]) a quarter of the draws hold only the second build, which the
    # rounds drawn as if alike almost never do.
    plain = PLAIN_ROUNDS
    slower_second = PLAIN_ROUNDS[:5] + [1.05 * ms for ms in PLAIN_ROUNDS[5:]]
    rows = [_row("plain", plain), _row("horovod", slower_second)]
    alike = next(line for line in overhead_report.targets("cnn", "cpu", rows)
                 if line.startswith("cnn horovod:"))
    by_build = next(line for line in overhead_report.targets("cnn", "cpu", rows, builds=2)
                    if line.startswith("cnn horovod:"))
    assert "cannot tell" not in alike
    assert by_build.startswith("cnn horovod: 1.000x (target <= 1.03x) met; 90% of resampled "
                               "builds and rounds")
    assert by_build.endswith(": the rounds cannot tell")
    # A rendered report reads its builds from results.json.
    meta = {"device": "cpu", "command": "c", "torch": "t", "optimizer": "adamw", "rounds": 5,
            "instances": 2, "steps": 10, "round_ms": 60.0, "warmup": 30, "threads": 1,
            "allocator": "a"}
    (tmp_path / "results.json").write_text(json.dumps(
        {"meta": meta, "results": [{"model": "cnn", "steps": 10, "rows": rows, "builds": 2,
                                    "targets": []}]}), encoding="utf-8")
    assert overhead.main(["--render", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert report["results"][0]["targets"][0] == by_build


def test_gpt2s_layout_reads_what_each_candidate_adds_per_step() -> None:
    # Note [A host-bound step on a CPU]: no target of its own, the difference in milliseconds.
    rows = [_row("plain", PLAIN_ROUNDS), _row("horovod", [ms + 0.3 for ms in PLAIN_ROUNDS])]
    assert overhead_report.targets("gpt2_layout", "cpu", rows) == [
        "gpt2_layout horovod: adds 0.300 ms per step to the plain optimizer's; 90% of resampled "
        "rounds 0.300 to 0.300 ms"]
    meta = {"device": "cpu", "command": "c", "torch": "t", "optimizer": "adamw", "rounds": 10,
            "steps": 10, "round_ms": 60.0, "warmup": 30, "threads": 1, "allocator": "a"}
    text = overhead_report.markdown([{"model": "gpt2_layout", "steps": 10, "rows": rows,
                                      "targets": overhead_report.targets("gpt2_layout", "cpu",
                                                                         rows)}], meta)
    assert "## What each candidate adds per step" in text and "## Targets" not in text
    # Beside a model with targets, each reading sits under its own heading.
    cnn = {"model": "cnn", "steps": 10, "rows": rows,
           "targets": overhead_report.targets("cnn", "cpu", rows)}
    layout = {"model": "gpt2_layout", "steps": 10, "rows": rows,
              "targets": overhead_report.targets("gpt2_layout", "cpu", rows)}
    text = overhead_report.markdown([layout, cnn], meta)
    targets = text[text.index("## Targets"):text.index("## What each candidate adds")]
    added = text[text.index("## What each candidate adds"):]
    assert "cnn horovod" in targets and "gpt2_layout" not in targets
    assert "gpt2_layout horovod" in added and "cnn" not in added
