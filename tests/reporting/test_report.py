"""`python -m commsched report` on hand-written traces whose answers are worked out below."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from commsched.reporting import analysis, command

# Rank 0 (times in us). Plan mark at 0, so by default only iteration 1 (start-up to the first
# mark) is skipped; marks at 1000, 11000, 23000, 31000: iterations of 10, 12 and 8 ms, median 10.
# Two all-reduce blocks of 1 MB per iteration:
#   iteration 2: 5000-8000 and 7000-9000     busy 5000-9000   (4 ms)
#   iteration 3: 15000-19000 and 19000-21000 busy 15000-21000 (6 ms)
#   iteration 4: 24000-28000 and 28000-34000 busy 24000-31000 in the window (7 ms), 10 ms in all
# Waits: 6000-10000, 18000-22000, 27000-31000 (12 ms) and one before the window.
# Elapsed 30 ms: network idle 1 - 17/30, compute idle 12/30; busy while waiting 3 + 3 + 4 = 10 ms,
# so overlap (17 - 10) / 17. Wire bytes: 2(p-1)/p * 1e6 = 1e6 per block, 2e6 per iteration; over
# the rounds' own busy time 4 + 6 + 10 = 20 ms: 3e8 B/s, 0.24 of 10gbit (1.25e9 B/s).
RANK0_BLOCKS = [(100, 300), (300, 500), (5000, 8000), (7000, 9000), (15000, 19000),
                (19000, 21000), (24000, 28000), (28000, 34000)]
RANK0_WAITS = [(500, 900), (6000, 10000), (18000, 22000), (27000, 31000)]


def mark(name: str, ts: float, rank: int = 0) -> dict[str, Any]:
    return {"name": name, "ph": "i", "s": "p", "ts": ts, "pid": rank, "tid": 0}


def span(name: str, lane: int, start: float, end: float, **args: Any) -> dict[str, Any]:
    return {"name": name, "ph": "X", "ts": start, "dur": end - start, "pid": 0, "tid": lane,
            "args": args}


def rank0_events() -> list[dict[str, Any]]:
    events = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
              mark("plan horovod 0123 (2 blocks)", 0)]
    events += [mark(f"iteration {i + 1}", ts) for i, ts in enumerate([1000, 11000, 23000, 31000])]
    for i, (start, end) in enumerate(RANK0_BLOCKS):
        events.append(span("pack", 1, start - 50, start, block=i % 2, bytes=10**6, op="allreduce"))
        events.append(span("allreduce", 2, start, end, block=i % 2, bytes=10**6, op="allreduce"))
        events.append(span("unpack", 2, end, end + 20, block=i % 2, bytes=10**6, op="allreduce"))
    events += [span("wait", 3, start, end, what="all blocks") for start, end in RANK0_WAITS]
    events += [{"name": "ready:w", "ph": "i", "s": "t", "ts": t, "pid": 0, "tid": 0}
               for t in (4900, 14900, 23900)]
    return events


def rank1_events() -> list[dict[str, Any]]:
    """No plan mark; a reduce-scatter (shard of 500 B recorded) and its all-gather (1000 B) per
    iteration; iterations of 2 ms; network busy 0.5 ms per iteration, no waits."""
    events = [mark(f"iteration {i + 1}", ts, 1) for i, ts in enumerate([1000, 3000, 5000])]
    for base in (0, 2000, 4000):
        events.append(span("reduce_scatter", 2, base + 100, base + 400, block=0, bytes=500,
                           op="reduce_scatter"))
        events.append(span("all_gather", 2, base + 400, base + 600, block=1, bytes=1000,
                           op="all_gather"))
    return events


def write(path: pathlib.Path, events: list[dict[str, Any]], closed: bool = True) -> None:
    body = ",\n".join(json.dumps(e) for e in events)
    path.write_text("[\n" + body + ("\n]\n" if closed else ",\n"))


@pytest.fixture
def run_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    write(tmp_path / "timeline.rank0.json", rank0_events())
    write(tmp_path / "timeline.rank1.json", rank1_events())
    return tmp_path


def run(run_dir: pathlib.Path, *extra: str) -> dict[str, Any]:
    out = run_dir / "out.json"
    assert command.main([str(run_dir), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_rank0_numbers_worked_by_hand(run_dir: pathlib.Path) -> None:
    doc = run(run_dir, "--link", "10gbit")
    assert doc["world_size"] == 2 and doc["link_bytes_per_s"] == pytest.approx(1.25e9)
    r = doc["ranks"][0]
    assert r["rank"] == 0 and r["skip"] == 1 and r["iterations"] == 3
    assert r["iteration_times_s"] == pytest.approx([0.010, 0.012, 0.008])
    assert r["iteration_time_s"] == pytest.approx(0.010)
    assert r["elapsed_s"] == pytest.approx(0.030)
    assert r["network_busy_s"] == pytest.approx(0.017)
    assert r["network_idle"] == pytest.approx(1 - 17 / 30)
    assert r["wait_s"] == pytest.approx(0.012) and r["compute_busy_s"] == pytest.approx(0.018)
    assert r["compute_idle"] == pytest.approx(12 / 30)
    assert r["overlap"] == pytest.approx(7 / 17)
    assert r["collectives_per_iteration"] == 2
    assert r["wire_bytes_per_iteration"] == pytest.approx(2e6)
    assert r["achieved_bytes_per_s"] == pytest.approx(3e8)
    assert r["link_utilisation"] == pytest.approx(0.24)


def test_reduce_scatter_and_all_gather_wire_bytes(run_dir: pathlib.Path) -> None:
    r = run(run_dir)["ranks"][1]
    assert r["skip"] == 0 and r["iterations"] == 2 and r["iteration_time_s"] == pytest.approx(0.002)
    # p = 2: reduce-scatter (p-1) * 500 (shard recorded) + all-gather (p-1)/p * 1000
    assert r["wire_bytes_per_iteration"] == pytest.approx(1000)
    assert r["network_idle"] == pytest.approx(1 - 0.5 / 2) and r["compute_idle"] == 0
    assert r["overlap"] == pytest.approx(1.0)  # never waited: all communication hidden
    assert r["achieved_bytes_per_s"] == pytest.approx(1000 / 0.0005)
    assert r["link_utilisation"] is None  # no --link


def test_profile_world_size_wins_over_file_count(run_dir: pathlib.Path) -> None:
    (run_dir / "profile.json").write_text(json.dumps(
        {"world_size": 4, "tensors": [{"bytes": 300}, {"bytes": 700}]}))
    doc = run(run_dir)
    assert doc["world_size"] == 4 and doc["gradient_bytes"] == 1000
    # p = 4: 3 * 500 + 3/4 * 1000
    assert doc["ranks"][1]["wire_bytes_per_iteration"] == pytest.approx(2250)
    assert doc["ranks"][0]["wire_bytes_per_iteration"] == pytest.approx(2 * 2 * 3 / 4 * 1e6)


def test_skip_and_default_skip_after_re_plan(run_dir: pathlib.Path) -> None:
    r = run(run_dir, "--skip", "2")["ranks"][0]
    assert r["iterations"] == 2 and r["iteration_times_s"] == pytest.approx([0.012, 0.008])
    assert r["wire_bytes_per_iteration"] == pytest.approx(2e6)
    # A re-plan after mark 2 (as after profiling steps): iterations 1-3 began before it.
    write(run_dir / "timeline.rank0.json", [*rank0_events(), mark("plan x 1 (2 blocks)", 11500)])
    r = run(run_dir)["ranks"][0]
    assert r["skip"] == 3 and r["iteration_times_s"] == pytest.approx([0.008])


def test_unterminated_array_and_cut_off_last_event(run_dir: pathlib.Path) -> None:
    expected = run(run_dir)["ranks"][0]
    write(run_dir / "timeline.rank0.json", rank0_events(), closed=False)
    assert run(run_dir)["ranks"][0] == expected
    text = (run_dir / "timeline.rank0.json").read_text()
    (run_dir / "timeline.rank0.json").write_text(text + '{"name": "pack", "ph": "X", "ts": 9')
    assert run(run_dir)["ranks"][0] == expected


def test_markdown_table_and_plot(run_dir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    plot = run_dir / "one.png"
    doc = run(run_dir, "--link", "10gbit", "--plot", str(plot))
    out = capsys.readouterr().out
    assert "| rank | iterations | iteration ms | overlap |" in out
    assert "| 0 | 3 (skip 1) | 10.00 | 41% | 40% | 43% | 2.000 | 2400.0 | 24% |" in out
    assert doc["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run(run_dir)
    assert (run_dir / "report.png").exists()  # the default place


def test_timeline_without_block_ids_counts_by_launch_time(tmp_path: pathlib.Path) -> None:
    events = [mark(f"iteration {i + 1}", ts) for i, ts in enumerate([0, 1000, 2000])]
    events += [span("allreduce", 2, t, t + 100, bytes=400) for t in (500, 1500, 2500)]
    write(tmp_path / "timeline.rank0.json", events)
    (tmp_path / "profile.json").write_text(json.dumps({"world_size": 2}))
    r = run(tmp_path)["ranks"][0]
    # The span launched after the last mark (2500) belongs to no analysed iteration.
    assert r["wire_bytes_per_iteration"] == pytest.approx(400)
    assert r["network_busy_s"] == pytest.approx(0.0002)


@pytest.mark.parametrize(("setup", "problem"), [
    ("missing", "no such directory"),
    ("empty_dir", "no timeline files"),
    ("malformed", "malformed JSON"),
    ("not_array", "expected a JSON array"),
    ("no_marks", "no iteration marks"),
    ("one_mark", "no iteration left to analyse"),
    ("bad_profile", "malformed JSON"),
])
def test_errors_exit_2_with_one_line_naming_the_file(tmp_path: pathlib.Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    setup: str, problem: str) -> None:
    target = tmp_path / "run"
    culprit = target / "timeline.rank0.json"
    if setup != "missing":
        target.mkdir()
    if setup == "empty_dir":
        culprit = target
        (target / "notes.json").write_text("{}")
    elif setup == "malformed":
        culprit.write_text('[\n{"name": "iteration 1", "ph": "i", "ts": 1},\n{"name": }\n]\n')
    elif setup == "not_array":
        culprit.write_text('{"name": "iteration 1"}')
    elif setup == "no_marks":
        write(culprit, [span("allreduce", 2, 0, 10, block=0, bytes=4)])
    elif setup == "one_mark":
        write(culprit, [mark("iteration 1", 10)])
    elif setup == "bad_profile":
        write(culprit, rank0_events())
        culprit = target / "profile.json"
        culprit.write_text("{")
    if setup == "missing":
        culprit = target
    assert command.main([str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(culprit) in err[0] and problem in err[0], err


def test_bad_options_exit_2(run_dir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main([str(run_dir), "--link", "fast"]) == 2
    assert "--link" in capsys.readouterr().err
    assert command.main([str(run_dir), "--skip", "-1"]) == 2
    assert command.main([]) == 2  # argparse: RUN_DIR is required
    capsys.readouterr()
    blocker = run_dir / "a-file"
    blocker.write_text("not a folder")
    unwritable = blocker / "out.json"  # its folder would have to be a file's child
    assert command.main([str(run_dir), "--json", str(unwritable)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(unwritable) in err[0] and "--json" in err[0], err
    assert not (run_dir / "report.png").exists()  # failed at start: nothing was drawn


def test_output_folders_are_created(run_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "new" / "deeper"
    assert command.main([str(run_dir), "--json", str(out / "r.json"),
                         "--plot", str(out / "r.png")]) == 0
    assert json.loads((out / "r.json").read_text())["ranks"]
    assert (out / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_interval_helpers() -> None:
    assert analysis.merge([(5, 6), (0, 2), (1, 3), (4, 4)]) == [(0, 3), (5, 6)]
    assert analysis.intersect([(0, 3), (5, 9)], [(2, 6), (8, 10)]) == [(2, 3), (5, 6), (8, 9)]
    assert analysis.wire_bytes("allreduce", 100, 4) == pytest.approx(150)
    assert analysis.wire_bytes("reduce_scatter", 25, 4) == pytest.approx(75)
    assert analysis.wire_bytes("all_gather", 100, 4) == pytest.approx(75)
