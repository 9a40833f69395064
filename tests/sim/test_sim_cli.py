"""`python -m commsched simulate` end to end on a built-in profile, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsched.__main__ import main as commsched_main
from commsched.sim import builtin_models, load_profile
from commsched.sim.cli import main
from commsched.sim.profile import BUILTIN_PROFILES, builtin_path

PNG = b"\x89PNG\r\n\x1a\n"


def test_simulate_writes_table_json_and_plots(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = main(["--profile", "vgg16", "--workers", "1,16", "--bandwidth", "10gbit,100gbit",
                 "--compression", "1,4", "--json", str(out), "--plot", str(tmp_path / "s.png"),
                 "--timeline", str(tmp_path / "t.png"), "--markdown", str(tmp_path / "t.md")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "vgg16: T1 (no communication)" in printed and "speed-up" in printed
    doc = json.loads(out.read_text())
    rows = doc["models"]["vgg16"]["rows"]
    assert len(rows) == 2 * 2 * 2 * 6  # workers x bandwidth x compression x policies
    t1 = doc["models"]["vgg16"]["compute_only_s"]
    for row in rows:
        assert row["scaling"] == pytest.approx(t1 / row["iteration_s"])
        if row["workers"] == 1:  # nothing to communicate
            assert row["scaling"] == pytest.approx(1.0, abs=1e-9)
            assert row["compression_for_target"] == 1.0
        if row["policy"] == "horovod":
            assert row["speedup_vs_horovod"] == pytest.approx(1.0)
        target = row["compression_for_target"]
        assert target == "unreachable" or 1.0 <= target <= 1000
    # more bandwidth never makes an iteration slower
    slow = {(r["policy"], r["workers"], r["compression"]): r["iteration_s"] for r in rows
            if r["bandwidth_gbit_s"] == 10}
    for r in rows:
        if r["bandwidth_gbit_s"] == 100:
            assert r["iteration_s"] <= slow[(r["policy"], r["workers"], r["compression"])] + 1e-12
    for name in ("s.png", "t.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert "Horovod vs the fastest policy" in (tmp_path / "t.md").read_text()


def test_dispatch_through_python_m_commsched(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert commsched_main(["simulate", "--profile", "resnet50", "--workers", "8",
                           "--bandwidth", "25gbit", "--policy", "horovod,dear",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["models"]["resnet50"]["rows"]
    assert [r["policy"] for r in rows] == ["horovod", "dear"]


def test_fitted_network_of_the_profile(tmp_path: Path) -> None:
    doc = json.loads(builtin_path("vgg16").read_text())
    doc["world_size"] = 4
    doc["collectives"] = {"allreduce": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "r.json"
    assert main(["--profile", str(path), "--fitted", "--policy", "horovod",
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["models"][str(path)]["rows"]
    assert row["workers"] == 4 and row["bandwidth_gbit_s"] is None
    assert row["compression_for_target"] is None


@pytest.mark.parametrize(("args", "message"), [
    (["--bandwidth", "10gbits"], "bandwidth '10gbits': expected a number with a unit"),
    (["--bandwidth", "fast"], "bandwidth 'fast'"),
    (["--latency", "3 parsecs"], "latency '3 parsecs'"),
    (["--workers", "0"], "--workers '0'"),
    (["--compression", "0.5"], "--compression '0.5'"),
    (["--policy", "fastest"], "--policy 'fastest'"),
])
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "vgg16", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_malformed_profile_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(builtin_path("vgg16").read_text())
    doc["tensors"][3]["numel"] = -4
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert main(["--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tensors[3] ('features.2.bias').numel: expected a whole number >= 0, got -4" in err
    assert main(["--profile", str(tmp_path / "nothing.json")]) == 2
    assert "not a built-in profile" in capsys.readouterr().err
    assert main([]) == 2  # --profile is required (argparse's message)
    assert main(["--help"]) == 0


def test_builtin_profiles_match_their_generator_and_architectures() -> None:
    expected = {"resnet50": (25_557_032, 8.18), "vgg16": (138_357_544, 30.94),
                "bert-base": (110_106_428, 28.5)}
    for name in BUILTIN_PROFILES:
        shipped = json.loads(builtin_path(name).read_text())
        assert shipped == json.loads(json.dumps(builtin_models.document(
            builtin_models.MODELS[name]())))
        params, gflops = expected[name]
        assert shipped["generated"]["parameters"] == params
        assert shipped["generated"]["forward_gflops_per_sample"] == pytest.approx(gflops, rel=1e-3)
        run = load_profile(name)
        assert run.has_module_info and run.before_first_ready_s and run.step_s
        assert sum(t.numel for t in run.tensors) == params
