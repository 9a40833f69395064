"""One chaos trial's training job (benchmarks/harness/chaos.py draws and checks the trials).

    horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script D --gloo \\
        python -m benchmarks.harness.chaos_job DIR
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 -m benchmarks.harness.chaos_job DIR

DIR/trial.json says the launcher ("elastic": inside ``hvd.elastic.run``, committing every
step; "torchrun": a checkpoint every SAVE_EVERY steps with commsched.checkpoint, resumed from
at start), the policy (elastic trials: optionally with "+powersgd", "+topk", or "+kfac", a
K-FAC preconditioner in Horovod's state beside the optimizer), and the kill: the rank that
is killed (SIGKILL, or os._exit(1) where the trial says "exit"; once per trial: a marker
file), at which step, and where:
  * top: at the top of the step, before zero_grad() and the forward pass;
  * forward: in the second layer's forward pre-hook;
  * backward: in a gradient hook of the first layer's weight (the last gradient of backward);
  * in_step: as the wrapped optimizer's step() begins (before it launches what is left);
  * step: inside the user's optimizer update (in step() under a synchronous plan; in the next
    forward pass's update groups under an overlap plan, which is where the update runs);
  * save: while the checkpoint is written (torchrun: on rank 0 after the file is written,
    before its rename, on the others in their call of the save; elastic: inside
    ``state.commit()``, as the model's state is read).
Every rank logs to DIR/log.<id>.jsonl: each step it finished (with the world size it ran in),
each error it raised (type, text, time), its start; rank 0 saves its final parameters to
DIR/final.pt. The killed rank writes DIR/killed (rank, step, point, time) first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from typing import Any

import torch
from torch import nn

import commsched
from commsched.kfac import KFACPreconditioner
from commsched.optimizer import _DistributedOptimizer as Wrapped

from . import replay

STEPS, SAVE_EVERY = 12, 3
LR, MOMENTUM = 0.05, 0.9


def make_model(entry: str = "") -> nn.Sequential:
    """The trial's model; in float64 under K-FAC, whose damped inverses magnify rounding."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 2))
    return model.double() if entry.endswith("+kfac") else model


def reference(steps: list[tuple[int, int]], entry: str = "horovod",
              binds: list[int] | None = None) -> list[torch.Tensor]:
    """One process replaying `steps` ((step, world size)) of a trial of `entry` (a policy,
    optionally with "+powersgd", "+topk" or "+kfac"): each step's gradient is the average over
    that step's ranks, as the job's ranks computed it (benchmarks/harness/replay.py; `binds`:
    how many times the job had bound to a world at each step)."""
    mode = entry.partition("+")[2] or None
    model = make_model(entry)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    history = [(step, list(range(size))) for step, size in steps]
    if mode == "kfac":
        return replay.replay_kfac(model, opt, replay.make_preconditioner(model, LR), history,
                                   replay.batch)
    # The job's SGD is KillableSGD, whose step() is its own: top-k keeps plain error feedback.
    return replay.replay(model, opt, history, replay.loss_of, mode, binds, dgc=False)


class Chaos:
    """Where this process kills itself, and its log."""

    def __init__(self, out_dir: str, trial: dict[str, Any], log_id: str) -> None:
        self.out_dir, self.kill = out_dir, trial["kill"]
        self.log_path = os.path.join(out_dir, f"log.{log_id}.jsonl")
        self.marker = os.path.join(out_dir, "killed")
        self.armed: str | None = None
        self._step = self._rank = -1

    def arm(self, step: int, rank: int) -> None:
        """At the start of each step: whether this rank dies somewhere in it. A kill in the
        update stays armed into the next step: an overlap plan applies a step's update in the
        next forward pass."""
        hit = step == self.kill["step"] and rank == self.kill["rank"]
        if hit and not os.path.exists(self.marker):
            self.armed = self.kill["point"]
            self._step, self._rank = step, rank
        elif self.armed != "step":
            self.armed = None

    def at(self, point: str) -> None:
        if self.armed != point:
            return
        with open(self.marker, "w", encoding="utf-8") as handle:
            json.dump({"rank": self._rank, "step": self._step, "point": point,
                       "time": time.time()}, handle)
        if self.kill.get("how") == "exit":
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)

    def log(self, **fields: Any) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**fields, "time": time.time()}) + "\n")


class KillableSGD(torch.optim.SGD):
    """SGD whose update may kill the process ("step"): the update runs inside step() under a
    synchronous plan, in the next forward pass under an overlap plan."""

    chaos: Chaos | None = None

    def step(self, closure: Any = None) -> Any:
        if KillableSGD.chaos is not None:
            KillableSGD.chaos.at("step")
        return super().step(closure)


def wrap(model: nn.Sequential, chaos: Chaos, entry: str) -> Wrapped:
    KillableSGD.chaos = chaos
    model[2].register_forward_pre_hook(lambda module, args: chaos.at("forward"))

    def backward(grad: torch.Tensor) -> torch.Tensor:
        chaos.at("backward")
        return grad

    first = model[0]
    assert isinstance(first, nn.Linear)
    first.weight.register_hook(backward)
    policy, _, mode = entry.partition("+")
    with warnings.catch_warnings():  # top-k under KillableSGD: plain error feedback, as replayed
        warnings.simplefilter("ignore")
        opt = commsched.DistributedOptimizer(
            KillableSGD(model.parameters(), lr=LR, momentum=MOMENTUM),
            named_parameters=model.named_parameters(), model=model, policy=policy,
            profile_steps=2, compression=replay.LOSSY.get(mode))
    opt.register_step_pre_hook(lambda *args: chaos.at("in_step"))
    return opt  # type: ignore[return-value]


def train_step(model: nn.Module, opt: Wrapped, step: int, rank: int,
               precond: KFACPreconditioner | None = None) -> None:
    opt.zero_grad()
    replay.loss_of(model, step, rank).backward()
    if precond is None:
        opt.step()
        return
    opt.synchronize()  # docs/kfac.md's loop
    precond.step()
    with opt.skip_synchronize():
        opt.step()


def run_torchrun(out_dir: str, trial: dict[str, Any]) -> None:
    rank = commsched.init().rank
    chaos = Chaos(out_dir, trial, f"rank{rank}")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = make_model()
    opt = wrap(model, chaos, trial["policy"])
    path = os.path.join(out_dir, "ckpt")
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:  # the kill "during a save": written, not yet renamed
        chaos.at("save")
        real_fsync(fd)

    os.fsync = fsync
    state = commsched.checkpoint.load(path)
    start = 0 if state is None else int(state["step"])
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    chaos.log(event="start", attempt=attempt, rank=rank, start=start)
    for step in range(start, STEPS):
        chaos.arm(step, rank)
        chaos.at("top")
        try:
            train_step(model, opt, step, rank)
            if (step + 1) % SAVE_EVERY == 0:
                checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "step": step + 1}
                if rank != 0:  # in the save, which rank 0 alone writes
                    chaos.at("save")
                commsched.checkpoint.save(path, checkpoint)
        except Exception as err:
            chaos.log(event="error", step=step, error=type(err).__name__, text=str(err))
            raise
        chaos.log(event="step", step=step, size=commsched.size())
    finish(out_dir, model, opt, rank)


def run_elastic(out_dir: str, trial: dict[str, Any]) -> None:
    import horovod.torch as hvd

    hvd.init()
    host = os.environ.get("HOROVOD_HOSTNAME", "local")
    chaos = Chaos(out_dir, trial, host)
    model = make_model(trial["policy"])
    opt = wrap(model, chaos, trial["policy"])
    precond = replay.make_preconditioner(model, LR) if trial["policy"].endswith("+kfac") \
        else None
    model.register_state_dict_pre_hook(lambda *args: chaos.at("save"))
    chaos.log(event="start", host=host)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.batch < STEPS:
            step, rank, size = state.batch, hvd.rank(), hvd.size()
            chaos.arm(step, rank)
            chaos.at("top")
            try:
                train_step(model, opt, step, rank, precond)
                state.batch = step + 1
                # state.commit() in its two parts: once saved, the step is committed, whatever
                # Horovod's check for host updates raises next (a lost peer shows there too).
                state.save()
                chaos.log(event="step", step=step, size=size, rank=rank,
                          binds=opt.session.binding.binds)
                state.check_host_updates()
            except Exception as err:
                if type(err).__name__ != "HostsUpdatedInterrupt":
                    chaos.log(event="error", step=step, error=type(err).__name__,
                              text=str(err))
                raise

    kept: dict[str, Any] = {} if precond is None else {"kfac": precond}
    train(hvd.elastic.TorchState(model=model, optimizer=opt, batch=0, **kept))
    finish(out_dir, model, opt, hvd.rank())


def finish(out_dir: str, model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    opt.flush()  # type: ignore[attr-defined]  # an overlap plan's last update
    if rank == 0:
        torch.save({"params": [p.detach().clone() for p in model.parameters()],
                    "size": commsched.size()}, os.path.join(out_dir, "final.pt"))
    commsched.shutdown()


def main(out_dir: str) -> int:
    torch.set_num_threads(1)
    with open(os.path.join(out_dir, "trial.json"), encoding="utf-8") as handle:
        trial = json.load(handle)
    if trial["launcher"] == "elastic":
        run_elastic(out_dir, trial)
    else:
        run_torchrun(out_dir, trial)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
