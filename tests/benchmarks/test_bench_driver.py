"""The benchmark driver and its table of jobs (benchmarks/harness/driver.py, bench_jobs.py):
the commands each job runs, its knobs, its failures and its report."""

from __future__ import annotations

import importlib.util
import io
import os
import pathlib
import sys

import pytest

from benchmarks.harness import bench_jobs, driver
from benchmarks.harness.bench_jobs import JOBS, Job, Launch, Launcher

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_every_job_runs_a_program_that_exists() -> None:
    for job in JOBS.values():
        launches = job.launches(job.knobs_from({}))
        assert launches, job.name
        for launch in launches:
            program = launch.argv[0]
            if program == "-m":
                assert importlib.util.find_spec(launch.argv[1]) is not None, (job.name, launch)
            else:
                assert (REPO / program).is_file(), (job.name, program)
        # Today's command of the job still runs it.
        wrapper = (REPO / "scripts" / f"bench_{job.name}.sh").read_text()
        assert f'bench.sh" {job.name} "$@"' in wrapper, job.name


def test_knobs_come_from_the_environment_and_change_the_commands() -> None:
    knobs = bench_jobs.OVERLAP.knobs_from({"CNN_RATE": "2gbit", "UNRELATED": "x"})
    assert knobs["CNN_RATE"] == "2gbit" and knobs["TRANSFORMER_RATE"] == "1gbit"
    assert "UNRELATED" not in knobs
    lines = driver.dry_run(bench_jobs.OVERLAP, knobs)
    # The link is shaped before the runs at its rate, again only when the rate changes.
    assert [line for line in lines if line.startswith("scripts/netem.sh up")] == [
        "scripts/netem.sh up 2gbit", "scripts/netem.sh up 1gbit", "scripts/netem.sh up 2gbit"]
    runs = [line for line in lines if not line.startswith("scripts/netem.sh up")]
    assert len(runs) == 3 and all(line.startswith("scripts/netem.sh run .venv/bin/horovodrun -np ")
                                  for line in runs)
    assert "-np 3 " in runs[2] and "--out benchmarks/overlap/cnn-3ranks" in runs[2]
    assert "'loopback shaped to 2gbit'" in runs[0]
    assert bench_jobs.OVERLAP.command_line(knobs) == \
        "CNN_RATE=2gbit TRANSFORMER_RATE=1gbit scripts/bench_overlap.sh"


def test_commands_by_launcher() -> None:
    plain = Launch(("-m", "x"))
    assert driver.command(plain) == [".venv/bin/python", "-m", "x"]
    torchrun = Launch(("script.py",), ranks=2, launcher=Launcher.TORCHRUN, rate="1gbit")
    assert driver.command(torchrun)[:4] == ["scripts/netem.sh", "run", ".venv/bin/torchrun",
                                            "--nproc-per-node=2"]
    assert driver.command(torchrun)[-1] == "script.py"


def test_rank0_stdout_keeps_rank_0s_lines_and_logs_all() -> None:
    stream = io.StringIO("[0]<stdout>:table\n[1]<stdout>:other\n[0]<stderr>:warning\n")
    out, log = io.StringIO(), io.StringIO()
    driver.rank0_stdout(stream, out, log)
    assert out.getvalue() == "table\n"
    assert log.getvalue() == stream.getvalue()


def _job(tmp_path: pathlib.Path, codes: list[int]) -> Job:
    runs = [Launch(("-c", f"import sys; open(r'{tmp_path}/ran{i}', 'w'); sys.exit({code})"))
            for i, code in enumerate(codes)]
    return Job("fake", "a test's job", {"OUT": str(tmp_path)}, lambda _: runs,
               lambda knobs: f"report of {knobs['OUT']}\n")


def test_a_failed_run_ends_the_job_with_its_status_and_no_report(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "VENV_BIN", os.path.dirname(sys.executable))
    job = _job(tmp_path, [0, 3, 0])
    assert driver.run_job(job, job.knobs_from({})) == 3
    assert (tmp_path / "ran0").exists() and (tmp_path / "ran1").exists()
    assert not (tmp_path / "ran2").exists() and not (tmp_path / "README.md").exists()


def test_a_job_writes_its_report_after_its_runs(tmp_path: pathlib.Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "VENV_BIN", os.path.dirname(sys.executable))
    job = _job(tmp_path, [0, 0])
    assert driver.run_job(job, job.knobs_from({})) == 0
    assert (tmp_path / "README.md").read_text() == f"report of {tmp_path}\n"


def test_unknown_jobs_and_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert driver.main(["no-such-job"]) == 2
    assert "no job 'no-such-job'" in capsys.readouterr().err
    assert driver.main(["overlap", "--seeds", "3"]) == 2
    assert "takes no arguments (--seeds 3)" in capsys.readouterr().err
    assert driver.main(["kfac_convergence", "--dry-run", "--seeds", "3"]) == 0
    assert capsys.readouterr().out.strip().endswith("--seeds 3")


def test_results_section_moves_the_title_down(tmp_path: pathlib.Path) -> None:
    # As the scripts' `sed 's/^# /## /'` did: the title only.
    (tmp_path / "results.md").write_text("# cnn on 2 ranks\n\n| a |\n## kept\n")
    assert bench_jobs.results_section(str(tmp_path / "results.md")) == \
        "## cnn on 2 ranks\n\n| a |\n## kept"


def test_a_model_without_jobs_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MODELS", "gpt2 t5")
    assert driver.main(["real", "--dry-run"]) == 2
    assert "no jobs for model 't5'" in capsys.readouterr().err


def test_parts_and_report_only_choose_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    shard = bench_jobs.SHARD.knobs_from({})
    assert all("shard_memory" not in line
               for line in driver.dry_run(bench_jobs.SHARD, {**shard, "ARGS": "speed"}))
    with pytest.raises(bench_jobs.JobError, match="no part 'both'"):
        bench_jobs.SHARD.launches({**shard, "ARGS": "both"})
    sim = bench_jobs.SIM.knobs_from({"REPORT_ONLY": "1"})
    assert bench_jobs.SIM.launches(sim) == []
    # 2 rates x (CNN, Transformer) and the CNN on 3 ranks at one, then the sharded three.
    every = bench_jobs.SIM.launches(bench_jobs.SIM.knobs_from({}))
    assert [launch.ranks for launch in every] == [2, 2, 3, 2, 2, 2, 2, 3]
    only = bench_jobs.SIM.launches(bench_jobs.SIM.knobs_from({"PARTS": "sharded"}))
    assert all("--memory" in launch.argv for launch in only) and len(only) == 3
    scale = bench_jobs.SCALE.knobs_from({"SIMULATE_ONLY": "1", "MODELS": "gpt2"})
    assert [launch.argv[1] for launch in bench_jobs.SCALE.launches(scale)[:-1]] == ["commsched"]


def test_a_run_with_a_log_of_its_own_writes_its_output_there(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(driver, "VENV_BIN", os.path.dirname(sys.executable))
    log = tmp_path / "run.log"
    prepared: list[str] = []
    job = Job("fake", "a test's job", {"OUT": str(tmp_path)},
              lambda _: [Launch(("-c", "print('measured')"), log=str(log))],
              prepare=lambda knobs: prepared.append(knobs["OUT"]))
    assert driver.dry_run(job, job.knobs_from({})) and not prepared  # a dry run changes nothing
    assert driver.run_job(job, job.knobs_from({})) == 0
    assert prepared == [str(tmp_path)] and log.read_text() == "measured\n"
    assert "measured" not in capfd.readouterr().out
