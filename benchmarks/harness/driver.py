"""One driver for the benchmark jobs of `benchmarks/harness/bench_jobs.py` (the table): shape the
link, launch each run, write the job's README. From the repository root, after
`scripts/lib/common.sh` set the environment up (scripts/bench.sh does both):

    scripts/bench.sh overlap              # CNN_RATE=2gbit scripts/bench.sh overlap, ...
    scripts/bench.sh overlap --dry-run    # the commands it would run, one per line
    scripts/bench.sh --list               # the jobs

Note [One driver, a table of jobs]
Every benchmark job is the same three steps: shape a loopback (scripts/netem.sh), launch
programs (python, horovodrun or torchrun, under the namespace where the link is shaped) and
write a README from what they wrote. The driver owns the steps: the namespace is torn down on
exit, on Ctrl-C and on a failed run, and a run that fails ends the job with its status. A job
is data: its knobs (environment variables, with their defaults), its runs and its report, so a
job reads as a row and `--dry-run` shows its commands without running them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import IO

from .bench_jobs import JOBS, Job, JobError, Knobs, Launch, Launcher

NETEM = "scripts/netem.sh"
VENV_BIN = ".venv/bin"


def command(launch: Launch) -> list[str]:
    """The command line of one run, as typed from the repository root."""
    python = f"{VENV_BIN}/python"
    if launch.launcher is Launcher.PYTHON:
        argv = [python, *launch.argv]
    elif launch.launcher is Launcher.HOROVODRUN:
        argv = [f"{VENV_BIN}/horovodrun", "-np", str(launch.ranks), "--gloo", python,
                *launch.argv]
    else:
        argv = [f"{VENV_BIN}/torchrun", f"--nproc-per-node={launch.ranks}",
                "--master-addr=127.0.0.1", "--master-port=29533", *launch.argv]
    return [NETEM, "run", *argv] if launch.rate is not None else argv


def with_shaping(launches: list[Launch]) -> Iterator[tuple[str | None, Launch]]:
    """Each launch with the rate the link must be shaped to before it: its own where that
    differs from the rate already set, else None."""
    shaped = None
    for launch in launches:
        change = launch.rate if launch.rate is not None and launch.rate != shaped else None
        shaped = change or shaped
        yield change, launch


def dry_run(job: Job, knobs: Knobs) -> list[str]:
    """What running `job` would do, one line per step (shaping and runs), nothing run."""
    lines = []
    for rate, launch in with_shaping(job.launches(knobs)):
        if rate is not None:
            lines.append(f"{NETEM} up {rate}")
        lines.append(shlex.join(command(launch)))
    return lines


def rank0_stdout(stream: IO[str], out: IO[str], log: IO[str] | None) -> None:
    """A horovodrun job's output: every line to `log`, rank 0's stdout without its prefix to
    `out`."""
    prefix = "[0]<stdout>:"
    for line in stream:
        if log is not None:
            log.write(line)
        if line.startswith(prefix):
            out.write(line[len(prefix):])
            out.flush()


def run_job(job: Job, knobs: Knobs) -> int:
    """Runs every launch of `job`, then writes its report. Returns the exit status: the first
    failed run's, else 0. The namespace a run shaped is deleted however the job ends (Ctrl-C
    and failures included); a job that shaped nothing touches no namespace."""
    env = {**os.environ, "NETNS": job.netns_from(os.environ)}
    log_path = os.environ.get("BENCH_LOG")
    shaped = False
    launches = job.launches(knobs)  # a knob it cannot run is refused before anything changes
    job.prepare(knobs)
    try:
        for rate, launch in with_shaping(launches):
            if rate is not None:
                shaped = True
                subprocess.run([NETEM, "up", rate], env=env, check=True)
            status = _launch(launch, env, log_path)
            if status != 0:
                print(f"bench: {job.name}: {shlex.join(command(launch))} exited with {status}",
                      file=sys.stderr)
                return status
    finally:
        if shaped:
            subprocess.run([NETEM, "down"], env=env, check=False)
    if job.report is not None:
        readme = os.path.join(knobs["OUT"], "README.md")
        text = job.report(knobs)
        with open(readme, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"bench: {job.name}: wrote {readme}", file=sys.stderr)
    return 0


def _launch(launch: Launch, job_env: Mapping[str, str], log_path: str | None) -> int:
    """One run. A horovodrun job shows rank 0's stdout and appends everything to BENCH_LOG
    (`log_path`); a run with a log of its own writes its whole output there instead."""
    env = {**job_env, **dict(launch.env)}
    if launch.launcher is not Launcher.HOROVODRUN:
        if not launch.log:
            return subprocess.run(command(launch), env=env, check=False).returncode
        with open(launch.log, "w", encoding="utf-8") as handle:
            return subprocess.run(command(launch), env=env, stdout=handle,
                                  stderr=subprocess.STDOUT, check=False).returncode
    with subprocess.Popen(command(launch), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        kept = launch.log or log_path
        log = open(kept, "a", encoding="utf-8") if kept else None  # noqa: SIM115
        try:
            rank0_stdout(child.stdout, sys.stdout, log)
        finally:
            if log is not None:
                log.close()
        return child.wait()


def main(argv: list[str] | None = None) -> int:
    """`scripts/bench.sh JOB [--dry-run]`: runs one job of the table.

    Args:
        argv: the arguments, without the program's name.

    Returns:
        The exit status: the first failed run's, 2 for an unknown job, else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?", help="the job's name (--list: every job)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--list", action="store_true", help="list the jobs and what each runs")
    # Any other argument goes on to the job's harness, where it takes them (its ARGS knob).
    args, passed_on = parser.parse_known_args(argv)
    if args.list or args.job is None:
        for name, job in JOBS.items():
            print(f"{name}: {job.summary}")
        return 0 if args.list else 2
    if args.job not in JOBS:
        print(f"bench: no job {args.job!r}; the jobs: {', '.join(JOBS)}", file=sys.stderr)
        return 2
    job = JOBS[args.job]
    knobs = job.knobs_from(os.environ)
    if passed_on:
        if "ARGS" not in knobs:
            print(f"bench: the job {job.name!r} takes no arguments ({shlex.join(passed_on)})",
                  file=sys.stderr)
            return 2
        knobs["ARGS"] = shlex.join(passed_on)
    try:
        if args.dry_run:
            print("\n".join(dry_run(job, knobs)))
            return 0
        return run_job(job, knobs)
    except JobError as err:
        print(f"bench: {job.name}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
