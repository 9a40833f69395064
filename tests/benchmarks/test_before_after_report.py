"""The before/after report (benchmarks/harness/before_after.py): calls read from the counting
script's table, each timing over its own run's control, and a change flagged as slower only
beyond the spread between one side's runs."""

from __future__ import annotations

import json
import pathlib

from benchmarks.harness import before_after


def _run(root: pathlib.Path, name: str, calls: float, dear_kept: float, horovod: float) -> None:
    run = root / name
    (run / "overhead").mkdir(parents=True)
    (run / "cnn").mkdir()
    (run / "calls.md").write_text(
        "| model | policy | Python calls / iteration | of them in commsched |\n"
        f"|---|---|---:|---:|\n| mlp | dear | {calls} | {calls / 2} |\n")
    (run / "overhead" / "results.json").write_text(json.dumps({"results": [{
        "model": "mlp", "rows": [{"candidate": "plain", "best_median_ms": 1.0},
                                 {"candidate": "dear (engine kept)",
                                  "best_median_ms": dear_kept}]}]}))
    (run / "cnn" / "results.json").write_text(json.dumps({"rows": [
        {"name": "torch-ddp", "median_ms": 100.0},
        {"name": "commsched:horovod", "median_ms": horovod}]}))


def test_a_change_counts_as_slower_only_beyond_the_spread(tmp_path: pathlib.Path) -> None:
    _run(tmp_path, "base-1", 300, 1.10, 90.0)
    _run(tmp_path, "base-2", 300, 1.12, 92.0)
    _run(tmp_path, "head-1", 280, 1.11, 99.0)  # horovod 0.08 slower against a 0.02 spread
    _run(tmp_path, "head-2", 280, 1.13, 100.0)
    summary = before_after.summarise(tmp_path, rounds=2)
    assert summary["calls"]["mlp dear"] == {"base": (300.0, 150.0), "head": (280.0, 140.0)}
    rows = {r["measure"]: r for r in summary["timed"]}
    assert not rows["mlp dear (engine kept)"]["slower_beyond_noise"]
    assert rows["cnn 2 ranks commsched:horovod"]["slower_beyond_noise"]
    before_after.render(tmp_path, summary, {"base": "abc", "rounds": 2, "rate": "1gbit",
                                            "command": "scripts/bench_before_after.sh"})
    readme = (tmp_path / "README.md").read_text()
    row = "| cnn 2 ranks commsched:horovod | 0.900, 0.920 | 0.990, 1.000 | +0.085 | 0.020 | yes |"
    assert row in readme
    assert (tmp_path / "results.png").stat().st_size > 0
