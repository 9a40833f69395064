"""scripts/timeline_summary.py's `--cycle` table: per cycle of one tensor's gradient, the link's
idle time, the waits and the updates, on a timeline made up here (µs, as the engine writes)."""

from __future__ import annotations

from typing import Any

from script_modules import load_script

summary = load_script("timeline_summary")


def _span(name: str, ts: float, dur: float, tid: int = 3, **args: Any) -> dict[str, Any]:
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "tid": tid, "args": args}


def _ready(ts: float, tensor: str = "fc.weight") -> dict[str, Any]:
    return {"name": f"ready:{tensor}", "ph": "i", "ts": ts}


def test_a_cycle_shows_the_idle_link_the_waits_and_the_updates() -> None:
    events = [_ready(0), _ready(1_000_000), _ready(1_900_000),
              # first cycle: two overlapping collectives, 0-600 ms, one wait until 650 ms
              _span("allreduce", 0, 400_000, tid=2, bytes=8),
              _span("allreduce", 300_000, 300_000, tid=2, bytes=8),
              _span("wait", 100_000, 550_000), _span("wait", 20_000, 10_000),
              _span("update", 650_000, 100_000), _span("update", 660_000, 5_000, tid=9),
              # second cycle: the link busy 1000-1500 and 1700-1800 ms, the wait ends at
              # 1500 ms, no update; conv's gradient at 1650 ms, 50 ms before the link takes it
              _span("allreduce", 1_000_000, 500_000, tid=2, bytes=8),
              _span("allreduce", 1_700_000, 100_000, tid=2, bytes=8),
              _span("wait", 1_200_000, 300_000), _ready(1_650_000, "conv.weight")]
    lines = summary.cycle_lines(events, skip=0, tensor="fc.weight")
    # The first cycle's link idles 600-1000 ms, until fc's next gradient (0); the second's
    # longest idle stretch, 1500-1700 ms, outlasts conv's gradient by 50 ms (-50).
    assert lines[2:] == ["| 1 | 1000 | 600 | 400 | 560 | 105 | 100 | 400 | 0 |",
                         "| 2 | 900 | 600 | 300 | 300 | 0 | 0 | 200 | -50 |"]


def test_cycles_before_skip_are_left_out() -> None:
    events = [_ready(0), _ready(1_000), _ready(2_000)]
    assert len(summary.cycle_lines(events, skip=1, tensor="fc.weight")) == 3
