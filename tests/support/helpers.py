"""distributed_test: runs a function on N ranks (processes) joined by torch.distributed (Gloo).

Each rank sees RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as under torchrun, so
``commsched.init()`` takes its torchrun path. The whole job has a hard timeout: ranks still
running then are killed and the failure says which ones hung; a rank that died by a signal or a
non-zero exit code, or raised, is reported with its traceback.

Beside it, the small steps several tests share: step_alike (a wrapped optimizer and the plain one
it must match, stepped side by side) and one_group_per_module.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch


class DistributedTestError(AssertionError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int,
               env: dict[str, str], cwd: str, args: tuple, results: Any, timeout: float) -> None:
    # A rank still running just before the parent kills it prints every thread's stack, so a
    # hang names the call it is stuck in.
    faulthandler.dump_traceback_later(max(timeout - 3.0, 1.0), exit=False)
    # The parent's environment and folder as they are now, not the forkserver's (Note [Ranks
    # forked from a warm server]).
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch

    torch.set_num_threads(1)
    try:
        # Plain pickle bytes: torch would otherwise share tensor storage through file
        # descriptors that vanish when this process exits.
        results.put((rank, "ok", pickle.dumps(fn(*args))))
    except BaseException:  # reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))
    finally:
        import commsched

        commsched.shutdown()
        faulthandler.cancel_dump_traceback_later()


# Note [Ranks forked from a warm server]
# Each rank used to be a spawned interpreter that imported torch and commsched itself: about 2 s
# of one core per rank, paid some 400 times by the suite on a 2-core machine. Ranks now fork
# from one forkserver that imported them once (multiprocessing preloads them there), so a rank
# starts with the imports done and only runs its test's function. What must stay per process
# stays so: no torch.distributed group, no commsched engine or thread exists before the fork
# (importing starts none). The server was started with the environment and folder of the test
# that first needed it, so each rank takes the calling test's own, as a spawned rank did,
# before it calls commsched.init(); nothing in torch's or commsched's import reads a variable
# a test sets.
_PRELOADED = ("torch", "torch.distributed", "torch.nn", "commsched", "helpers")


def _rank_context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOADED))
    return ctx


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def distributed_test(fn: Callable[..., Any], world_size: int = 2, timeout: float = 60.0,
                     env: dict[str, str] | None = None, args: tuple = (),
                     expect_errors: bool = False, may_die: tuple[int, ...] = ()) -> dict[int, Any]:
    """Returns {rank: return value}; with `expect_errors`, {rank: traceback text or value}.
    Ranks in `may_die` are allowed to end without reporting (fault-injection tests kill them)."""
    ctx = _rank_context()
    results = ctx.Queue()
    port = free_port()
    environ = {**os.environ, **(env or {})}
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, environ, os.getcwd(),
                                                  args, results, timeout), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    outcomes: dict[int, tuple[str, Any]] = {}
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.2)
            outcomes[rank] = (status, pickle.loads(value) if status == "ok" else value)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                break
    for proc in procs:
        proc.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    problems = []
    if hung:
        reported = [r for r in hung if r in outcomes]
        problems.append(f"ranks {hung} hung: still running after {timeout:.0f} s, killed"
                        + (f" (ranks {reported} had returned: the hang is in shutdown)"
                           if reported else "") + "; their stacks are in the captured stderr")
    for rank, proc in enumerate(procs):
        if rank in may_die and rank not in outcomes:
            continue
        if rank not in outcomes and rank not in hung:
            problems.append(f"rank {rank} reported nothing ({_describe_exit(proc.exitcode)})")
        elif rank in outcomes and proc.exitcode not in (0, None) and rank not in hung:
            problems.append(f"rank {rank} ended with {_describe_exit(proc.exitcode)}")
    errors = {r: v for r, (s, v) in outcomes.items() if s == "error"}
    if not expect_errors:
        problems += [f"rank {r} raised:\n{tb}" for r, tb in sorted(errors.items())]
    if problems:
        raise DistributedTestError("\n".join(problems))
    return {r: v for r, (_, v) in sorted(outcomes.items())}


def one_group_per_module(opt: Any) -> list[str]:
    """Under a running overlap plan, applies one update group per first-using module (the
    grouping the runner falls back to when nothing is measured) and returns the hooked modules;
    [] otherwise. A small model at full speed gets one group, applied at the root; this puts
    pre-hooks inside the model (compiled frames, checkpointed blocks)."""
    import dataclasses

    runner = opt.session.modes.runner
    if runner is None or not runner.active:
        return []
    opt.flush()
    runner.activate(dataclasses.replace(opt.plan, update_groups=()))
    return list(runner.hooked_modules)


def step_alike(pairs: Sequence[tuple[torch.nn.Module, torch.optim.Optimizer]],
               x: torch.Tensor) -> None:
    """One training step of each (model, optimizer) on the same input, the sum of the squared
    outputs as the loss: a wrapped optimizer beside the plain one it must match."""
    for model, optimizer in pairs:
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
