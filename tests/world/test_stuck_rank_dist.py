"""A rank that is alive but stuck (issue 17, item 1): rank 0's error starts with the culprit and
says how it is stuck, within COMMSCHED_TIMEOUT + 10 s, under every policy family (synchronous
`horovod`, `bytescheduler`, `dear`) and for K-FAC; the stall warning, at its default (a fifth of
the timeout), comes first and says the same.

Rank 1 gets stuck in step STUCK_AT in one of three ways, one case after the other in one job per
family: after backward, before step(); in forward; after a backward that left out a branch of
the model (its gradients are never handed over). It stays stuck until rank 0 has its error
(a key in the rendezvous store), then both close their optimizer and go on to the next case.
The heartbeats keep beating all along: only the diagnosis can tell what rank 1 is doing.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from helpers import distributed_test

from commsched.config import load_config
from commsched.world.liveness import classify

pytestmark = pytest.mark.processes

TIMEOUT = 5.0  # COMMSCHED_TIMEOUT of the optimizers (the world's own stays at its default)
MARGIN = 10.0  # what the error may take beyond TIMEOUT
PROFILE_STEPS = 2
STUCK_AT = 4  # the step in which rank 1 gets stuck: the policy's own plan runs by then
HANG_LIMIT = 60.0  # rank 1 gives up waiting for rank 0's error (the test then fails)
START_UP = 90.0  # spawning the ranks while the other families' jobs do the same, on 2 cores
CASES = ("before_step", "forward", "skipped_gradient")
FAMILIES = ("horovod", "bytescheduler", "dear", "kfac")
# What rank 0's error says of rank 1 in each case, and what the stall warning's line says.
IN_ERROR = {"before_step": "rank 1 is stuck after backward, before step()",
            "forward": "rank 1 is stuck in forward of iteration",
            "skipped_gradient": "rank 1 is stuck in backward of iteration"}
IN_WARNING = {"before_step": "rank 1: stuck after backward, before step()",
              "forward": "rank 1: stuck in forward",
              "skipped_gradient": "rank 1: missing 'b.weight', 'b.bias'"}
NOT_HANDED_OVER = "it has not handed over 'b.weight', 'b.bias' (handed over on rank 0)"


class _Abandoned(Exception):
    """Rank 1 leaves the case once rank 0 has its error."""


def _case(family: str, case: str, rank: int, store: Any, stalls: list[str]) -> dict:
    import torch
    from torch import nn

    import commsched
    from commsched.kfac import KFACPreconditioner

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.head = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 4)
            self.use_b = True
            self.hang: Any = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            if self.use_b:  # the branch rank 1 leaves out in "skipped_gradient"
                h = h + torch.relu(self.b(x))
            if self.hang is not None:
                self.hang()
            return self.head(h)

    key = f"stuck/{family}/{case}"

    def hang() -> None:
        deadline = time.monotonic() + HANG_LIMIT
        while not store.check([key + "/released"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise _Abandoned

    torch.manual_seed(0)
    model = Net()
    policy = "horovod" if family == "kfac" else family
    opt = commsched.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), model=model,
                                         policy=policy, profile_steps=PROFILE_STEPS)
    precond = (KFACPreconditioner(model, inv_update_steps=2, profile_steps=PROFILE_STEPS)
               if family == "kfac" else None)
    data = torch.Generator().manual_seed(rank)

    def one_step(step: int) -> None:
        stuck = rank == 1 and step == STUCK_AT
        model.use_b = not (stuck and case == "skipped_gradient")
        model.hang = hang if stuck and case == "forward" else None
        opt.zero_grad()
        model(torch.randn(8, 16, generator=data)).square().mean().backward()
        if stuck:
            hang()
        if precond is None:
            opt.step()
            return
        opt.synchronize()
        precond.step()
        with opt.skip_synchronize():
            opt.step()

    out: dict[str, Any] = {"error": None}
    started, step = time.monotonic(), -1
    try:
        for step in range(STUCK_AT + 4):
            started = time.monotonic()  # the error's time counts from its iteration's start
            if step == STUCK_AT:
                stalls.clear()
            one_step(step)
        opt.flush()
    except commsched.RankFailureError as err:
        out = {"error": str(err), "seconds": time.monotonic() - started, "step": step,
               "warnings": list(stalls)}
    except _Abandoned:
        out = {"error": None, "abandoned": step}
    finally:
        if rank == 0:
            store.set(key + "/released", "1")
        opt.session.close()
        if precond is not None:
            precond.shutdown()
        # Both closed before the next case wraps its optimizer (a collective).
        store.set(f"{key}/closed/{rank}", "1")
        store.wait([f"{key}/closed/{1 - rank}"])
    return out


def _stuck_job(family: str) -> dict:
    import datetime
    import logging
    import os

    import torch.distributed as dist

    import commsched

    rank = commsched.init().rank  # the world keeps the default timeout: start-up may be slow
    os.environ["COMMSCHED_TIMEOUT"] = str(TIMEOUT)  # the optimizers' and K-FAC's waits
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2,
                          is_master=False, timeout=datetime.timedelta(seconds=HANG_LIMIT + 30))
    stalls: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "commsched stall" in record.getMessage():
                stalls.append(record.getMessage())

    logging.getLogger("commsched").addHandler(Collect())
    return {case: _case(family, case, rank, store, stalls) for case in CASES}


def test_stuck_rank_is_named_with_how_it_is_stuck() -> None:
    def one(family: str) -> dict:
        return distributed_test(_stuck_job, world_size=2, expect_errors=True, args=(family,),
                                timeout=START_UP + len(CASES) * (TIMEOUT + MARGIN + 15))

    # The jobs mostly wait: all at once.
    with ThreadPoolExecutor(max_workers=len(FAMILIES)) as pool:
        outcomes = dict(zip(FAMILIES, pool.map(one, FAMILIES), strict=True))
    problems = []
    for family, results in outcomes.items():
        for rank, result in results.items():
            if not isinstance(result, dict):  # a traceback: the rank raised something else
                problems.append(f"{family}: rank {rank} raised:\n{result}")
        if problems:
            continue
        for case in CASES:
            out, other = results[0][case], results[1][case]
            where = f"{family}/{case}"
            if other.get("abandoned") != STUCK_AT:
                problems.append(f"{where}: rank 1 did not get stuck as planned: {other}")
            error = out["error"]
            if error is None:
                problems.append(f"{where}: rank 0 finished although rank 1 was stuck")
                continue
            if not error.startswith(IN_ERROR[case]):
                problems.append(f"{where}: the error does not start with "
                                f"{IN_ERROR[case]!r}:\n{error}")
            if case == "skipped_gradient" and NOT_HANDED_OVER not in error:
                problems.append(f"{where}: the error does not say {NOT_HANDED_OVER!r}:\n{error}")
            if not re.search(r" for \d+\.\d s", error.split("commsched:")[0]):
                problems.append(f"{where}: the error does not say for how long:\n{error}")
            if not STUCK_AT <= out["step"] <= STUCK_AT + 2:
                problems.append(f"{where}: the error came in step {out['step']}:\n{error}")
            if out["seconds"] >= TIMEOUT + MARGIN:
                problems.append(f"{where}: the error took {out['seconds']:.1f} s")
            if not any(IN_WARNING[case] in w for w in out["warnings"]):
                problems.append(f"{where}: no stall warning with {IN_WARNING[case]!r} before "
                                f"the error; warnings: {out['warnings']}")
    assert not problems, "\n".join(problems)


# -- the diagnosis and the default, without processes ------------------------------------------


def _state(beat: int, iteration: int, not_ready: list[str], phase: str | None,
           waiting: float | None = None, phase_s: float = 7.0, round_: int | None = None,
           label: str = "gradients") -> dict:
    engine = {"iteration": iteration, "round": iteration if round_ is None else round_,
              "label": label, "waiting_s": waiting, "not_ready": not_ready}
    state: dict[str, Any] = {"beat": beat, "engines": {"0": engine}, "left": False}
    if phase is not None:
        state.update(phase=phase, phase_s=phase_s, phase_iteration=iteration)
    return state


def test_classify_names_each_kind_of_culprit() -> None:
    me = _state(5, 4, [], "step", waiting=5.0)
    cases: dict[str, tuple[dict[int, dict | None], str]] = {
        "silent": ({1: _state(3, 4, [], "backward")}, "rank 1 stopped responding (no heartbeat"),
        "exited": ({1: {**_state(3, 4, [], "backward"), "pid": 77, "host": "h"}},
                   "rank 1's process (pid 77 on h) has ended without calling "
                   "commsched.shutdown(): it crashed, was killed"),
        "left": ({1: {"beat": -1, "engines": {}, "left": True}}, "rank 1 left"),
        "never": ({1: None}, "rank 1 stopped responding (it never sent a heartbeat)"),
        "before step": ({1: _state(9, 3, [], "backward", round_=3)},
                        "rank 1 is stuck after backward, before step(), in iteration 3 (the "
                        "others are in 4) for 7.0 s"),
        "forward": ({1: _state(9, 4, ["w", "b"], "forward")},
                    "rank 1 is stuck in forward of iteration 4 for 7.0 s (after step()"),
        "missing": ({1: _state(9, 4, ["w"], "backward")},
                    "rank 1 is stuck in backward of iteration 4 for 7.0 s: it has not handed "
                    "over 'w' (handed over on rank 0)"),
        "in step": ({1: _state(9, 3, [], "step")}, "rank 1 is stuck in step() of iteration 3"),
    }
    for name, (peer, expected) in cases.items():
        before = {0: me, **{r: (state if name in ("silent", "exited") else None)
                            for r, state in peer.items()}}
        verdict = classify({0: me, **peer}, me=0, before=before,
                           exited=lambda state: state.get("pid") == 77)
        assert verdict.text.startswith(expected), (name, verdict.text)
        assert verdict.ranks == [1], (name, verdict)
    # A peer waiting in a collective too, in the same iteration, is no culprit.
    verdict = classify({0: me, 1: _state(9, 4, [], "step", waiting=4.0)}, me=0, before={})
    assert verdict.ranks == [] and "every peer still sends heartbeats" in verdict.text
    assert "rank 1 waiting in a collective in step() of iteration 4" in verdict.text
    # Three ranks: rank 1 waits an iteration behind rank 0 because rank 2 is stuck: rank 2 only.
    verdict = classify({0: _state(5, 5, [], "forward", waiting=5.0),
                        1: _state(9, 4, [], "forward", waiting=3.0),
                        2: _state(9, 4, [], "backward", round_=4)}, me=0, before={})
    assert verdict.ranks == [2], verdict.text
    # The stall inspector does not name a rank that has been where it is for a moment only.
    assert classify({0: me, 1: _state(9, 4, [], "forward", phase_s=0.1)},
                    min_seconds=1.0).ranks == []


@pytest.mark.parametrize("environ,expected", [
    ({}, 60.0), ({"COMMSCHED_TIMEOUT": "20"}, 4.0),
    ({"COMMSCHED_TIMEOUT": "20", "COMMSCHED_STALL_WARNING": "30"}, 30.0),
    ({"COMMSCHED_STALL_WARNING": "0"}, 0.0)])
def test_stall_warning_default_follows_the_timeout(environ: dict, expected: float) -> None:
    config = load_config(environ=environ)
    assert config.stall_warning == expected
    assert load_config({"timeout": 10}, environ={}).stall_warning == 2.0


_INSPECT_ONCE = """
import logging, sys
from commsched.world.liveness import Liveness
me = {"beat": 5, "engines": {"0": {"iteration": 4, "round": 4, "label": "gradients",
      "waiting_s": 5.0, "not_ready": []}}, "left": False, "phase": "step", "phase_s": 5.0,
      "phase_iteration": 4}
stuck = {"beat": 9, "engines": {"0": {"iteration": 4, "round": 4, "label": "gradients",
         "waiting_s": None, "not_ready": ["w"]}}, "left": False, "phase": "forward",
         "phase_s": 7.0, "phase_iteration": 4}
inspector = Liveness.__new__(Liveness)  # the stall inspector alone: no store, no thread
inspector.rank, inspector.size, inspector.stall_warning, inspector._warned = 0, 2, 1.0, set()
inspector._read_all = lambda: {0: me, 1: stuck}
inspector._state = lambda: me
if sys.argv[1] == "logging":
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
inspector._inspect()
"""


@pytest.mark.parametrize("setup", ["bare", "logging"])
def test_a_stall_is_told_once_where_logging_is_not_set_up(setup: str) -> None:
    """Note [One stall warning on the screen]: the warning, once, naming commsched rather than
    a line of its source; and the log's copy too where the program set logging up."""
    out = subprocess.run([sys.executable, "-c", _INSPECT_ONCE, setup], capture_output=True,
                         text=True, timeout=120, check=True).stderr
    assert out.count("rank 1: stuck in forward of iteration 4") == (1 if setup == "bare" else 2)
    assert out.startswith("commsched:0: StallWarning: commsched stall: a rank has waited 5 s "
                          "(COMMSCHED_STALL_WARNING=1); the ranks holding it up:"), out
    assert "warnings.warn" not in out and ("LOG commsched stall" in out) == (setup == "logging")


def test_the_first_heartbeat_goes_out_at_once() -> None:
    """A rank that fails within its first interval has beaten once: the others read it as
    silent since that beat, or as left, not as a rank that never sent a heartbeat."""
    import torch.distributed as dist

    from commsched.world import liveness

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    beating = liveness.Liveness("127.0.0.1", store.port, 0, 1, 0.0, lambda: [], "first/")
    try:
        deadline = time.monotonic() + liveness.INTERVAL / 2
        while not store.check(["first/" + liveness.PREFIX + "0"]):
            assert time.monotonic() < deadline, "no heartbeat within half an interval"
            time.sleep(0.01)
    finally:
        beating.stop()
