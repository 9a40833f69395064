"""The floor of a schedule: the shortest iteration that any cross-iteration schedule keeping
synchronous semantics can reach, from a profile and a network.

The naive bound, max(compute, one all-reduce of every gradient), assumes that every byte can be
on the wire while any compute runs. A schedule that keeps synchronous semantics cannot do that:

* a gradient is not sent before it is ready (tensor i at `release_i` = before_first_ready +
  ready_i, from the start of its iteration);
* its update is applied before its first use in the next forward (at `T + use_i`, where T is the
  period and use_i the forward time spent before the module that first uses it);
* in between, the channel carries it; it carries one collective at a time.

Note [The floor's windows]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Each gradient is a job on one machine (the channel) with a release time and a deadline. Since
every deadline falls in the next forward and every release in the backward after it, the jobs of
consecutive iterations never compete, so one iteration decides. Preemptive scheduling with
release times and deadlines is feasible iff every window [s, e] has room for the jobs that must
run inside it (released at or after s, due at or before e). For the window opened by release
threshold r and closed by use threshold u, with S(r, u) = {i : ready_i >= r, use_i <= u}:

    alpha + beta * bytes(S)  <=  (T + u) - (before_first_ready + r)

so T >= before_first_ready + r - u + alpha + beta * bytes(S). At least one collective carries S,
hence one alpha; splitting only adds more. The floor is the largest of these, of the compute
(forward, backward, and the update: the cheaper of the profiled step and one optimizer call
over every byte), and of the channel's work per period, alpha + beta * bytes(all): every
gradient crosses once per iteration whatever the deadlines (a profile whose module times add up
to more than its before_first_ready, which timing noise allows, would otherwise leave even the
widest window below it). The transfer cost per window is the cheaper of an all-reduce and a
reduce-scatter plus all-gather (see cheapest_transfer), so DeAR's plans are bounded too. With
r = 0 and u = the last use, it contains the naive bound's communication term; a tied
embedding/output weight (ready last, used first) gives the window that adds its whole transfer
to the compute: the tied-head gap.

Deadlines take the forward time of every module listed before the first user, which can only
make them later (a parent's whole own time counts before its children run): the floor stays a
lower bound. Without module information every tensor is due when the next backward could
start at the earliest (before_first_ready into the next iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Collective
from .network import Network
from .profile import RunProfile, ready_offsets
from .timing import ComputeTimes, compute_times


@dataclass(frozen=True)
class ScheduleFloor:
    floor_s: float
    compute_s: float  # forward + backward + the cheaper of step_s and one optimizer call
    naive_s: float  # max(compute, one all-reduce of every gradient)
    window_s: float  # the tightest window's bound on the period (0 with no gradients)
    binding: tuple[str, ...]  # the tensors that window must carry
    notes: tuple[str, ...] = ()

    @property
    def gap_s(self) -> float:
        """What synchronous semantics add to the naive bound."""
        return self.floor_s - self.naive_s


def cheapest_transfer(net: Network) -> tuple[float, float]:
    """(alpha, beta) no schedule can beat: one all-reduce, or DeAR's reduce-scatter then
    all-gather where the network makes that pair cheaper (each term taken at its minimum)."""
    ar = net.allreduce_model()
    big = 1 << 30
    pair_alpha = net.time(Collective.REDUCE_SCATTER, 0) + net.time(Collective.ALL_GATHER, 0)
    pair_beta = (net.time(Collective.REDUCE_SCATTER, big) + net.time(Collective.ALL_GATHER, big)
                 - pair_alpha) / big
    return min(ar.alpha, pair_alpha), min(ar.beta, pair_beta)


def use_offsets(run: RunProfile) -> list[float]:
    """Per tensor: forward time spent before its first user module starts (see the Note)."""
    compute = compute_times(run, with_modules=True)
    start: dict[str, float] = {}
    elapsed = 0.0
    for name, own in compute.modules:
        start.setdefault(name, elapsed)
        elapsed += own
    return [start.get(t.module, elapsed) if t.module is not None else elapsed
            for t in run.tensors]


def profile_compute_s(run: RunProfile) -> float:
    """One iteration's compute in `run`: forward, backward, and the cheaper of the profiled
    step and one optimizer call over every byte (sync plans pay step_s once; overlap plans one
    call per update group, at least one). A world of one takes this long at best.

    Args:
        run: a profile.

    Returns:
        Seconds.
    """
    ready, _ = ready_offsets(run)
    return _compute_s(compute_times(run, with_modules=run.has_module_info), ready,
                      run.total_bytes)


def _compute_s(compute: ComputeTimes, ready: list[float], total_bytes: int) -> float:
    """profile_compute_s from what schedule_floor has already read of the profile."""
    update = min(compute.step_s, compute.update.time(total_bytes))
    return compute.before_first_ready_s + max(ready, default=0.0) + update


def schedule_floor(run: RunProfile, net: Network) -> ScheduleFloor:
    ready, notes = ready_offsets(run)
    compute = compute_times(run, with_modules=run.has_module_info)
    total = run.total_bytes
    alpha, beta = cheapest_transfer(net)
    compute_s = _compute_s(compute, ready, total)
    allreduce = net.allreduce_model()
    naive = max(compute_s, allreduce.time(total)) if total else compute_s
    if not run.has_module_info:
        notes.append("no module information: every tensor is due when the next backward starts")
    uses = use_offsets(run) if run.has_module_info \
        else [compute.before_first_ready_s] * len(ready)
    window, binding = _tightest_window(ready, uses, [t.nbytes for t in run.tensors],
                                       compute.before_first_ready_s, alpha, beta)
    channel = alpha + beta * total if total else 0.0
    if channel > window:
        window, binding = channel, list(range(len(run.tensors)))
    names = tuple(run.tensors[i].name for i in binding)
    return ScheduleFloor(max(compute_s, window), compute_s, naive, window, names,
                         tuple(notes + compute.notes))


def _tightest_window(ready: list[float], uses: list[float], nbytes: list[int], before: float,
                     alpha: float, beta: float) -> tuple[float, list[int]]:
    """max over (r, u) of before + r - u + alpha + beta * bytes(S(r, u)), and that S.

    Tensors join in decreasing ready order (lowering r); for each r every distinct use threshold
    is tried with a running sum over tensors sorted by use: O(n^2) for n tensors, a few hundred
    at most."""
    order = sorted(range(len(ready)), key=lambda i: -ready[i])
    best, best_set = 0.0, []
    members: list[int] = []
    for k, i in enumerate(order):
        members.append(i)
        if k + 1 < len(order) and ready[order[k + 1]] == ready[i]:
            continue  # the threshold r takes in every tensor ready at r
        running = 0
        by_use = sorted(members, key=lambda j: uses[j])
        for pos, j in enumerate(by_use):
            running += nbytes[j]
            if pos + 1 < len(by_use) and uses[by_use[pos + 1]] == uses[j]:
                continue
            bound = before + ready[i] - uses[j] + alpha + beta * running
            if bound > best:
                best, best_set = bound, by_use[:pos + 1]
    return best, best_set
