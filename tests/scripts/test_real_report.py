"""scripts/real_report.py (issue 55, item 2): the floor a real model's best policy is judged
against comes from profiles that know when the next forward needs each tensor."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from script_modules import load_script


def load_report() -> ModuleType:
    return load_script("real_report")


def job(floor_ms: float, module_info: bool, rows: list[tuple[str, float]]) -> dict[str, Any]:
    hvd = dict(rows)["hvd"]
    return {"bound": {"floor_ms": floor_ms, "floor_module_info": module_info},
            "meta": {"command": "compare ...", "network": "loopback shaped to 4gbit"},
            "rows": [{"name": name, "median_ms": ms, "vs_hvd": ms / hvd} for name, ms in rows]}


def test_a_floor_without_first_users_gives_way_to_one_with_them() -> None:
    report = load_report()
    jobs = {"synchronous": job(2008.0, False, [("hvd", 3200.0), ("commsched:horovod", 3100.0)]),
            "overlap": job(2439.0, True, [("hvd", 3480.0), ("commsched:bytescheduler", 2849.0)])}
    assert report._floor(jobs) == (2439.0, True)
    lines = "\n".join(report.model_lines("gpt2", jobs))
    assert "Floor: 2439.0 ms (the lowest over the profiles that record each tensor's first " \
           "user)." in lines
    assert f"{2849.0 / 2439.0:.3f}x the floor" in lines


def test_without_first_users_anywhere_the_lowest_floor_is_taken_and_said_so() -> None:
    report = load_report()
    jobs = {"a": job(2100.0, False, [("hvd", 3000.0), ("commsched:horovod", 2900.0)]),
            "b": job(2008.0, False, [("hvd", 3000.0), ("commsched:mgwfbp", 3050.0)])}
    assert report._floor(jobs) == (2008.0, False)
    assert "none records first users" in "\n".join(report.model_lines("gpt2", jobs))


def test_both_targets_name_a_candidate_that_meets_them_in_its_own_job() -> None:
    report = load_report()
    # `auto` is best against its slow job's hvd but misses the floor's target; bytescheduler
    # meets both in the other job; dear meets neither.
    jobs = {"auto": job(2700.0, True, [("hvd", 3730.0), ("commsched:auto", 3060.0)]),
            "overlap": job(2750.0, True, [("hvd", 3340.0), ("commsched:bytescheduler", 2815.0),
                                           ("commsched:dear", 2900.0)])}
    lines = report.model_lines("bert", jobs)
    assert any(line.startswith("Best commsched policy: commsched:auto (auto)") for line in lines)
    assert f"Both targets in one candidate: commsched:bytescheduler (overlap), " \
           f"{2815.0 / 3340.0:.3f}x hvd, {2815.0 / 2700.0:.3f}x the floor." in lines


def test_both_targets_say_none_when_no_candidate_meets_them() -> None:
    report = load_report()
    jobs = {"overlap": job(2291.0, True, [("hvd", 2879.0), ("commsched:prophet", 2509.0)])}
    assert "Both targets in one candidate: none." in report.model_lines("gpt2", jobs)
