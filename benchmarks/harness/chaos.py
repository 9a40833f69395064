"""The chaos run (scripts/chaos.sh): trials that kill a random rank at a random point of a
training job, under elastic Horovod or under ``torchrun --max-restarts`` with commsched's
checkpoint files, and check how each one ended.

    python -m benchmarks.harness.chaos --trials 20 --seed 0 --deadline-s 1800 --out DIR

Each trial (chaos_job.py) ends, within its timeout, in one of two ways, or the run reports it
as a finding:
  * resumed: the job finished, and rank 0's parameters equal a one-process replay of the
    history it committed (elastic: each committed step with the world size it ran in;
    torchrun: every step once, resumed from the last whole checkpoint);
  * failed, culprit named: a job with no restart left (torchrun --max-restarts=0) stopped, and
    its output names the killed rank, within COMMSCHED_TIMEOUT + 10 s of the kill.
The run stops by itself after --trials trials or at --deadline-s, whichever comes first, and
writes DIR/results.json, DIR/results.md and DIR/results.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import torch

from . import chaos_job

POLICIES = ("horovod", "ddp", "mgwfbp", "bytescheduler", "prophet", "dear", "auto")
# Elastic trials also run these: the compressors' per-rank state starts afresh in each world,
# K-FAC's is restored whole (Note [Elastic Horovod and compressor state], Note [Elastic K-FAC]).
MODES = ("dear+powersgd", "horovod+topk", "mgwfbp+kfac")
POINTS = ("top", "forward", "backward", "in_step", "step", "save")
HOW = ("sigkill", "exit")  # SIGKILL, or os._exit(1) as a script that gives up would
HOSTS = ("127.0.0.1", "127.1", "127.0.1")  # one host name per elastic worker (Horovod
# blacklists a failed worker's host); each spells 127.0.0.1, so every worker runs here
COMMSCHED_TIMEOUT_S = 20
TOLERANCE = 1e-5  # float sums over 3 ranks round by where the ring adds each part
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def draw_trials(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` trials from `seed`: launchers alternate, policies and kill points are drawn in
    turn so that each appears (elastic trials take the MODES first), the killed rank and step
    at random; every fifth torchrun trial has no restart left and must fail naming the
    culprit."""
    rng = random.Random(seed)
    policies, points = list(POLICIES), list(POINTS)
    rng.shuffle(policies)
    rng.shuffle(points)
    entries = {"elastic": [*MODES, *policies[len(policies) // 2:], *policies[:len(policies) // 2]],
               "torchrun": policies}
    trials = []
    for index in range(count):
        launcher = "elastic" if index % 2 == 0 else "torchrun"
        world = 3 if launcher == "elastic" else 2
        restarts = 0 if launcher == "torchrun" and index % 10 == 9 else 1
        point = points[(index // 2) % len(points)]  # each launcher meets every point
        steps = range(2, chaos_job.STEPS - 2)
        if point == "save" and launcher == "torchrun":  # a step that ends with a checkpoint
            steps = range(chaos_job.SAVE_EVERY - 1, chaos_job.STEPS - 1, chaos_job.SAVE_EVERY)
        trials.append({"index": index, "launcher": launcher, "world": world,
                       "policy": entries[launcher][(index // 2) % len(entries[launcher])],
                       "restarts": restarts,
                       "kill": {"rank": rng.randrange(world), "step": rng.choice(steps),
                                "point": point, "how": HOW[index % 4 // 2]}})
    return trials


def command(trial: dict[str, Any], directory: str) -> list[str]:
    python = sys.executable
    if trial["launcher"] == "torchrun":
        return [os.path.join(os.path.dirname(python), "torchrun"), "--standalone",
                f"--nproc_per_node={trial['world']}", f"--max-restarts={trial['restarts']}",
                "-m", "benchmarks.harness.chaos_job", directory]
    with open(os.path.join(directory, "hosts"), "w", encoding="utf-8") as handle:
        handle.writelines(f"{host}:1\n" for host in HOSTS[:trial["world"]])
    discover = os.path.join(directory, "discover.sh")
    with open(discover, "w", encoding="utf-8") as handle:
        handle.write(f"#!/bin/sh\ncat '{os.path.join(directory, 'hosts')}'\n")
    os.chmod(discover, 0o755)
    return [os.path.join(os.path.dirname(python), "horovodrun"), "-np", str(trial["world"]),
            "--min-np", "2", "--max-np", str(trial["world"]), "--host-discovery-script",
            discover, "--gloo", python, "-m", "benchmarks.harness.chaos_job", directory]


def run_trial(trial: dict[str, Any], directory: str, timeout_s: float) -> dict[str, Any]:
    """Runs one trial in `directory` (made afresh) and returns its verdict."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    with open(os.path.join(directory, "trial.json"), "w", encoding="utf-8") as handle:
        json.dump(trial, handle)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMMSCHED_TIMEOUT": str(COMMSCHED_TIMEOUT_S),
           "HOROVOD_GLOO_TIMEOUT_SECONDS": "20",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.time()
    proc = subprocess.Popen(command(trial, directory), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        hung = True
    ended = time.time()
    with open(os.path.join(directory, "output.txt"), "w", encoding="utf-8") as handle:
        handle.write(output)
    return verdict(trial, directory, output, proc.returncode, hung, started, ended)


def read_logs(directory: str) -> list[dict[str, Any]]:
    lines = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("log.") and name.endswith(".jsonl"):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                lines += [{**json.loads(line), "log": name[4:-6]} for line in handle]
    return sorted(lines, key=lambda line: line["time"])


def committed_history(trial: dict[str, Any], lines: list[dict[str, Any]]
                      ) -> list[tuple[int, int]]:
    """(step, world size) of every step as it stands at the end: a step run again after a
    restore (or a restart from a checkpoint) counts once, as it ran last."""
    sizes: dict[int, int] = {}
    for line in lines:
        if line.get("event") == "step":
            sizes[line["step"]] = line["size"]
    return sorted(sizes.items())


def committed_binds(lines: list[dict[str, Any]]) -> list[int] | None:
    """For each committed step, as it ran last, how many times the optimizer had bound to a
    world (a lossy compressor starts afresh at each bind; every worker of a trial binds
    together, and none joins); None where not logged (torchrun)."""
    binds: dict[int, int] = {}
    for line in lines:
        if line.get("event") == "step" and "binds" in line:
            binds[line["step"]] = line["binds"]
    return [binds[step] for step in sorted(binds)] or None


def verdict(trial: dict[str, Any], directory: str, output: str, returncode: int | None,
            hung: bool, started: float, ended: float) -> dict[str, Any]:
    """How the trial ended, and whether that is one of the two allowed endings."""
    killed_path = os.path.join(directory, "killed")
    killed = None
    if os.path.exists(killed_path):
        with open(killed_path, encoding="utf-8") as handle:
            killed = json.load(handle)
    lines = read_logs(directory)
    out: dict[str, Any] = {**trial, "seconds": round(ended - started, 1), "killed": killed,
                           "returncode": returncode, "errors": sorted(
                               {line["error"] for line in lines if line.get("event") == "error"})}
    if hung:
        return {**out, "outcome": "hung", "ok": False}
    if killed is None:
        return {**out, "outcome": "no kill happened", "ok": False}
    final_path = os.path.join(directory, "final.pt")
    if trial["restarts"] == 0 and trial["launcher"] == "torchrun":
        named = f"rank: {killed['rank']}" in output or f"rank {killed['rank']}" in output
        within = ended - killed["time"] <= COMMSCHED_TIMEOUT_S + 10
        return {**out, "outcome": "failed, culprit named" if named else "failed, unnamed",
                "after_kill_s": round(ended - killed["time"], 1),
                "ok": returncode != 0 and named and within and not os.path.exists(final_path)}
    if returncode != 0 or not os.path.exists(final_path):
        return {**out, "outcome": f"failed (exit {returncode})", "ok": False}
    history = committed_history(trial, lines)
    final = torch.load(final_path)
    expected = chaos_job.reference(history, trial["policy"], committed_binds(lines))
    diff = max(float((p - q).abs().max()) for p, q in zip(final["params"], expected,
                                                          strict=True))
    complete = [step for step, _ in history] == list(range(chaos_job.STEPS))
    return {**out, "outcome": "resumed", "max_diff": diff, "history": history,
            "ok": complete and diff <= TOLERANCE}


def hosts_resolve() -> bool:
    try:
        return all(socket.gethostbyname(h) == "127.0.0.1" for h in HOSTS)
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=1800.0,
                        help="no trial starts after this many seconds")
    parser.add_argument("--trial-timeout-s", type=float, default=240.0)
    parser.add_argument("--out", default="benchmarks/chaos")
    parser.add_argument("--work", default="/tmp/commsched-chaos",
                        help="the trials' folders; a trial that did not end as it must is kept")
    args = parser.parse_args(argv)
    if not hosts_resolve():
        print(f"chaos: the host names {HOSTS} must all resolve to 127.0.0.1", file=sys.stderr)
        return 2
    from .chaos_report import write_report

    os.makedirs(args.out, exist_ok=True)
    began, results = time.time(), []
    for trial in draw_trials(args.trials, args.seed):
        if time.time() - began > args.deadline_s:
            break
        directory = os.path.join(args.work, f"trial{trial['index']:02d}")
        result = run_trial(trial, directory, args.trial_timeout_s)
        print(f"chaos: trial {trial['index']}: {trial['launcher']} {trial['policy']} kill "
              f"{trial['kill']} -> {result['outcome']} ({result['seconds']} s)", flush=True)
        results.append(result)
        if result["ok"]:
            shutil.rmtree(directory, ignore_errors=True)
    write_report(results, args, time.time() - began)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
