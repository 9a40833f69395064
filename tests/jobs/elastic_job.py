"""Runs under an elastic ``horovodrun`` (test_elastic_horovodrun.py): trains 20 steps inside
``hvd.elastic.run`` with a ``hvd.elastic.TorchState`` holding one model and commsched optimizer
per entry of ELASTIC_JOB_POLICY (comma-separated policies, default horovod, each optionally with
"+powersgd", "+topk", "+kfac" or "+ranks01"), side by side, committing after every step, while
the job loses a worker and (optionally) gains one.

Usage: elastic_job.py DIR KILL_AT ADD_AT ADD_HOST
    DIR       holds `hosts` (what the discovery script prints; rank 0 appends ADD_HOST to it at
              step ADD_AT) and receives, per worker host, `log.<host>.jsonl` (one line per
              executed step: step, Horovod's and commsched's world size, each plan and how
              many times each optimizer had bound to a world; a step run again after a restore
              appears again; or the error a step raised) and
              `final.<host>.pt` (each policy's parameters at the end)
    KILL_AT   the worker that is rank 1 at that step kills itself (SIGKILL) before its forward
              pass (once per job: a marker file in DIR); -1 for never. ELASTIC_JOB_KILL may
              say otherwise: "last" (the highest rank instead of rank 1), "exit" (os._exit(1)
              instead of SIGKILL), and where: "top" (the default), "backward" (in the first
              layer's gradient hook, the last gradient of backward), "step" (as step() begins)
              or "commit" (inside state.commit(), as the model's state is read); e.g.
              "last,exit,top"
    ADD_AT    at that step the workers wait until the added host has joined; -1 for never

Each rank's batch follows from (step, rank), so a reference replaying the logged steps with
their world sizes recomputes the average gradient of every committed step (`reference`); a
step averaged over the wrong ranks, applied twice or lost shows in the parameters. Under a
lossy compressor the replay runs every rank's compressor, each starting afresh at every bind
(Note [Elastic Horovod and compressor state] in commsched/runtime/elastic_guard.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from torch import nn

import commsched
from benchmarks.harness import replay  # on PYTHONPATH: the repository's root (support/launch.py)
from commsched.optimizer import _DistributedOptimizer as Wrapped

STEPS = 20
LR, MOMENTUM = 0.05, 0.9
JOIN_TIMEOUT_S = 120.0


def make_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def make_entry_model(entry: str) -> nn.Module:
    # K-FAC's damped inverses magnify rounding (by up to 1 / damping): in float64 the factors
    # summed over 3 ranks and over one concatenated batch still agree to well within 1e-6.
    return make_model().double() if entry.endswith("+kfac") else make_model()


# An entry of ELASTIC_JOB_POLICY ending in "+ranks01" reduces in the process set of ranks 0
# and 1 of each world (the other rank steps alone).
PROCESS_SET, SET_MEMBERS = "ranks01", [0, 1]


def committed_steps(log_lines: list[dict]) -> list[tuple[int, int]]:
    """(step, world size) of each step as it stands at the end: a step executed again after a
    restore replaces the earlier execution."""
    sizes: dict[int, int] = {}
    for line in log_lines:
        if "size" in line:
            sizes[line["step"]] = line["size"]
    return sorted(sizes.items())


def committed_binds(log_lines: list[dict], entry: str) -> list[int]:
    """For each committed step, how many times `entry`'s optimizer had bound to a world when it
    ran that step (a lossy compressor starts afresh at each bind)."""
    binds: dict[int, int] = {}
    for line in log_lines:
        if "size" in line:
            binds[line["step"]] = line["binds"][entry]
    return [binds[step] for step in sorted(binds)]


def reference(steps: list[tuple[int, int]], lossy: str | None = None,
              binds: list[int] | None = None,
              ranks: list[list[int]] | None = None) -> list[torch.Tensor]:
    """One process replaying `steps` (benchmarks/harness/replay.py): each one's gradient is the
    average over that step's ranks (or over `ranks[i]` for step i), or with `lossy` what its
    compressor makes of every rank's gradient, each rank's compressor state starting afresh
    where `binds` changes; "kfac" replays K-FAC."""
    history = [(step, list(range(size)) if ranks is None else ranks[i])
               for i, (step, size) in enumerate(steps)]
    model = make_entry_model(f"+{lossy}")
    opt = make_optimizer(model.parameters())
    if lossy == "kfac":
        return replay.replay_kfac(model, opt, replay.make_preconditioner(model, LR), history,
                                   replay.batch)
    return replay.replay(model, opt, history, replay.loss_of, lossy, binds)


def main(out_dir: str, kill_at: int, add_at: int, add_host: str) -> int:
    torch.set_num_threads(1)
    host = os.environ["HOROVOD_HOSTNAME"]
    hvd.init()
    # One model per policy, side by side in one job (each its own engine and plan): every one
    # must end where the same replay ends.
    policies = os.environ.get("ELASTIC_JOB_POLICY", "horovod").split(",")
    models = {entry: make_entry_model(entry) for entry in policies}
    opts = {entry: wrap(entry, model) for entry, model in models.items()}
    precs = {entry: replay.make_preconditioner(models[entry], LR) for entry in policies
             if entry.endswith("+kfac")}
    log_path = os.path.join(out_dir, f"log.{host}.jsonl")
    kill = Kill(os.environ.get("ELASTIC_JOB_KILL", ""), os.path.join(out_dir, "killed"),
                kill_at)
    for entry in policies:
        kill.arm(models[entry], opts[entry])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.batch < STEPS:
            step, rank, size = state.batch, hvd.rank(), hvd.size()
            kill.step = step
            kill.at("top")
            if step == add_at and size < 3:
                wait_for_new_host(state, out_dir, add_host)
            try:
                for entry, opt in opts.items():
                    opt.zero_grad()
                    replay.loss_of(models[entry], step, rank).backward()
                    if entry in precs:  # docs/kfac.md's loop
                        opt.synchronize()
                        precs[entry].step()
                        with opt.skip_synchronize():
                            opt.step()
                    else:
                        opt.step()
                state.batch = step + 1
                # state.commit() in its two parts. The save applies what an overlap plan defers
                # (Note [Elastic Horovod and deferred updates]): a lost peer may show there.
                # Once saved the step is committed, whatever the check for new hosts raises.
                state.save()
                write_step(log_path, step, size, rank, opts)
                state.check_host_updates()
            except HostsUpdatedInterrupt:
                raise
            except Exception as err:  # what Horovod's loop gets: it must be one it handles
                write_line(log_path, {"step": step, "error": type(err).__name__, "text": str(err),
                                      "horovod_internal": isinstance(err, HorovodInternalError)})
                raise

    handlers: dict[str, object] = {f"model_{i}": models[p] for i, p in enumerate(policies)}
    handlers.update({f"optimizer_{i}": opts[p] for i, p in enumerate(policies)})
    handlers.update({f"kfac_{i}": precs[p] for i, p in enumerate(policies) if p in precs})
    state = hvd.elastic.TorchState(batch=0, **handlers)
    train(state)
    torch.save({"params": {p: [t.detach() for t in m.parameters()] for p, m in models.items()},
                "size": hvd.size(), "rank": hvd.rank(),
                "iteration": {p: opt.session.state.iteration for p, opt in opts.items()}},
               os.path.join(out_dir, f"final.{host}.pt"))
    commsched.shutdown()
    return 0


class Kill:
    """Where and how the job loses its worker (KILL_AT, ELASTIC_JOB_KILL): once per job."""

    def __init__(self, spec: str, marker: str, step: int) -> None:
        words = set(filter(None, spec.split(",")))
        self.last, self.exit = "last" in words, "exit" in words
        points = words & {"top", "backward", "step", "commit"}
        self.point = points.pop() if points else "top"
        self._marker, self._at_step, self.step = marker, step, -1

    def arm(self, model: nn.Module, opt: Wrapped) -> None:
        first = next(model.parameters())
        first.register_hook(lambda grad: self.at("backward"))
        opt.register_step_pre_hook(lambda *args: self.at("step"))
        model.register_state_dict_pre_hook(lambda *args: self.at("commit"))

    def at(self, point: str) -> None:
        rank = hvd.rank()
        if point != self.point or self.step != self._at_step or os.path.exists(self._marker) \
                or rank != (hvd.size() - 1 if self.last else 1):
            return
        open(self._marker, "w").close()
        if self.exit:
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)


def wrap(entry: str, model: nn.Module) -> Wrapped:
    """The optimizer of an ELASTIC_JOB_POLICY entry: a policy, then "+powersgd", "+topk",
    "+kfac" (a K-FAC preconditioner beside it) or "+ranks01" (a process set)."""
    policy, _, lossy = entry.partition("+")
    return commsched.DistributedOptimizer(
        make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
        model=model, policy=policy, compression=replay.LOSSY.get(lossy),
        process_set=SET_MEMBERS if lossy == PROCESS_SET else None)


def write_step(path: str, step: int, size: int, rank: int, opts: dict) -> None:
    write_line(path, {"step": step, "size": size, "rank": rank,
                      "commsched_size": commsched.size(),
                      "plan": {p: opt.plan.fingerprint for p, opt in opts.items()},
                      "policy": {p: opt.plan.policy for p, opt in opts.items()},
                      "binds": {p: opt.session.binding.binds for p, opt in opts.items()}})


def write_line(path: str, line: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def wait_for_new_host(state: hvd.elastic.TorchState, out_dir: str, add_host: str) -> None:
    """Rank 0 lists `add_host` for the discovery script; every rank polls Horovod's host
    updates together (check_host_updates is a broadcast) until the reset that adds it."""
    if hvd.rank() == 0:
        with open(os.path.join(out_dir, "hosts"), "a", encoding="utf-8") as handle:
            handle.write(f"{add_host}:1\n")
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(0.5)
        state.check_host_updates()  # raises HostsUpdatedInterrupt once the host is added
    raise TimeoutError(f"{add_host} did not join within {JOIN_TIMEOUT_S:.0f} s")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
