"""`auto`'s close calls: which candidates it installs first, which runners-up it measures
after its choice, in what order, and which one it keeps. Pure functions of the ranking
(commsched.sim.rank_candidates); the state machine that runs them is
runtime/planning/auto/state.py."""

from __future__ import annotations

from collections.abc import Callable

from ....plan import Collective, Plan
from ....sim import Ranked

# Note [Overlap must win by a margin]
# A cross-iteration plan costs what the simulator does not charge: on the CPU its collectives'
# copies and reductions run on the cores the next forward pass computes on, and the runner's
# bookkeeping (taking the gradients out at step(), a hook and an optimizer call per group) comes
# on top of the update. Unshaped, 2 ranks, the built-in CNN: `auto` picked prophet, predicted a
# few percent ahead of horovod, and prophet then measured clearly slower than horovod (figures:
# benchmarks/notes/README.md, 'Overlap must win by a margin'). And
# the simulator has an error of its own (its median is measured in
# benchmarks/sim_validation/README.md). So an overlap plan is installed only when it is predicted
# faster than the best synchronous plan by more than OVERLAP_MARGIN; otherwise the synchronous plan,
# which also keeps Horovod's semantics (the parameters are final when step() returns). Where overlap
# pays (a shaped link), its predicted gain is several times the margin.
OVERLAP_MARGIN = 0.05

# Note [Measuring the close calls]
# The simulator errs by a few percent in the median and by more at worst (both measured in
# benchmarks/sim_validation/README.md), while candidates of different policies are often predicted
# within a few percent of each other: on the 3-rank CNN at 1 Gbit/s `auto` predicted dear well
# behind bytescheduler (its reduce-scatter fit rests on four samples) and dear measured faster. A
# close call is settled by measuring, as cuDNN's benchmark mode and DeepSpeed's autotuner do: after
# the choice's CHECK_STEPS, up to `auto_trials` runners-up of other policies predicted within
# TRIAL_WINDOW of it are measured, and the plan with the lowest measured time stays.
# * Interleaved, as the benchmarks' rounds are: TRIAL_ROUNDS rounds of TRIAL_STEPS steps of each
#   runner-up and of the choice, each plan's figure the median of its windows' medians. Back to
#   back, one 20-step window per plan, a slow phase of the machine falls on one plan alone:
#   unshaped, 2 ranks, the CNN, where one step's time spread widely, `auto` kept bytescheduler on
#   such windows and ran well outside the benchmarks' tolerance of the fastest candidate.
# * The choice's CHECK_STEPS window is not one of its trial windows: it runs first, right after
#   the profiling steps, while the process still warms up (unshaped, the Transformer: mgwfbp's
#   check measured slower than either of its two trial windows, and the slow check counted
#   against it).
# * One schedule is measured once: prophet and bytescheduler often plan the same partitions in
#   the same order, and a second policy with the choice's or a runner-up's very blocks, groups,
#   mode and credit gives its place to the next policy (unshaped, the Transformer: both took
#   the two places, and ddp, the fastest there in most runs, was never measured).
# A runner-up must also beat the choice by SWITCH_MARGIN: a smaller gain is not worth trusting
# a measurement for. The margin is half the benchmarks' 2% tolerance for `auto`, not all of it:
# with a margin of 2%, 2 ranks, the Transformer at 1 Gbit/s, bytescheduler 1 MiB measured faster
# than dear in the trials by just under the margin, dear stayed, and the benchmark's rounds then
# put dear more than the tolerance behind (figures: benchmarks/notes/README.md, 'Measuring the
# close calls'). Trials run once per choice, in the first hundred-odd steps of training; the
# plans they run are correct plans, only possibly slower ones.
TRIAL_WINDOW = 0.15
TRIAL_ROUNDS = 6

# Note [Trials of steady plans]
# The ranking's plans are made from the profiling steps, the run's first iterations, while the
# benchmarks' candidates and the plan `auto` keeps are planned again from their own steady
# iterations (Note [Planning from the steady state] in lifecycle.py). So a trial measured
# another plan than the one it stood for: unshaped, 2 ranks, the CNN, mgwfbp measured fastest
# of all candidates, ahead of horovod, in two runs in a row, while `auto`'s trial windows of
# mgwfbp's profiling-step plan read slower than horovod, and `auto` kept horovod, outside the
# benchmarks' tolerance of the fastest. When the trials start, every candidate to measure is planned
# again, with its knobs, from the window of the choice's check: the choice's iterations past
# the profiling steps, on the network fitted on the profiling steps, as the refinement does.
# Ready times are the backward's, which every synchronous plan and every overlap plan shares
# closely enough; what the plan itself changes is refined again for the plan kept. Six rounds,
# not four: unshaped, one plan's six window medians spread widely around their median here
# (ddp 1 MiB on the CNN), and a median of more windows moves less with one slow window (figures:
# benchmarks/notes/README.md, 'Trials of steady plans').

# Note [A prediction from another fit]
# The profiling steps fit the all-reduce on half of the units and reduce-scatter and all-gather
# on the other half (plan.units.layerwise_decoupled): dear is predicted from the second fit,
# every other policy from the first. Two predictions from one fit share its error, so their
# order holds better than their values; predictions from two fits carry both errors. On the
# 3-rank CNN at 1 Gbit/s (the overlap benchmark's run of 2026-11-25) auto's profile put dear
# more than TRIAL_WINDOW behind bytescheduler, so dear was never measured, and it measured
# several percent faster than bytescheduler; `auto` ended several percent behind it. In the
# simulator-validation job of the same code the reduce-scatter's per-byte cost, fitted from as
# many samples each time, came out far apart in dear's profiling steps and in auto's (figures:
# benchmarks/notes/README.md, 'A prediction from another fit'). So a runner-up whose
# collectives differ from the choice's is a close call within CROSS_FIT_TRIAL_WINDOW.
# The window covers an error of the fits, it does not remove one: on 3 ranks the profiling
# steps' reduce-scatter fit later ran more than twice dear's own, which put dear far behind
# bytescheduler, outside the window, where it measured ahead of it. That error was the wait for
# the latest rank's backward in the fit's one small first block; the profiling plan now opens
# with an all-reduce (Note [The block that opens the backward] in plan/units.py).
CROSS_FIT_TRIAL_WINDOW = 0.30

# Note [An overlap choice is measured against a synchronous one]
# What the simulator does not charge an overlap plan (Note [Overlap must win by a margin]) is
# not a fixed share: unshaped, 2 ranks, the CNN, `auto`'s re-plan chose bytescheduler 2 MiB,
# predicted well over the margin ahead of every synchronous plan, so none was measured; it ran
# well over its prediction in its trials and slower still in the benchmark's rounds, where mgwfbp
# ran clearly faster (figures: benchmarks/notes/README.md, 'An overlap choice is measured
# against a synchronous one'). So whenever the choice is an overlap plan, the best synchronous
# candidate is measured beside it, whatever its prediction, on top of the `auto_trials`
# runners-up: a plan with Horovod's semantics and none of overlap's costs is the baseline an
# overlap plan must beat by measurement, as it must by prediction.

# Note [A synchronous choice is measured against an overlap one]
# The mirror of the Note above: the simulator can also put overlap too far behind. VGG-16 on
# 2 ranks at 6 Gbit/s: `auto` installed mgwfbp, and every overlap plan was predicted more than
# TRIAL_WINDOW behind it (dear more than CROSS_FIT_TRIAL_WINDOW): its trials, which take every
# policy within those windows, measured only ddp and horovod. In the same job dear measured
# clearly faster than `auto`, and in the overlap job bytescheduler and prophet ran ahead of
# mgwfbp's synchronous job. Nor is that prediction steady: in the next run of the same job
# `auto`'s ranking put dear within a fraction of a percent of mgwfbp (figures:
# benchmarks/notes/README.md, 'A synchronous choice is measured against an overlap one'). So
# when the choice and all its runners-up are synchronous, the best overlap candidate is
# measured beside them, whatever its prediction. It comes on top of the `auto_trials`
# runners-up, and it brings no knob twin of its own: the trials already take 300-odd steps.

# Note [A quiet backward is measured too]
# Nor does the simulator charge what communication during the backward costs the backward: on
# the CPU, a collective's copies and reductions run on the cores the backward computes on. The
# plan that sends least during the backward, the synchronous one with the fewest blocks (`ddp`
# with its 25 MiB buckets: a first 1 MiB bucket, then the rest once the backward is done), is
# predicted behind every plan that overlaps, from compute measured under their traffic, and
# runs ahead of them where there is little to hide: unshaped, 2 ranks, the Transformer, ddp
# ran fastest of all commsched candidates in three runs out of three, ahead of mgwfbp, horovod
# and dear, while `auto`'s profile predicted it well behind horovod and never measured it, and
# `auto` ended outside the benchmarks' tolerance of the fastest (figures:
# benchmarks/notes/README.md, 'A quiet backward is measured too').
# So it is measured beside every choice it is predicted within CROSS_FIT_TRIAL_WINDOW of,
# on top of the `auto_trials` runners-up: a measurement settles what the model leaves out.

# Note [Knob settings the simulator cannot order]
# A runner-up is its policy's best-ranked knob setting, but two settings of one policy are often
# predicted closer than the simulator can tell apart (its median error is measured in
# benchmarks/sim_validation/README.md): 2 ranks, the Transformer at 1 Gbit/s, bytescheduler with
# 2 MiB partitions was predicted barely ahead of 1 MiB (from dear's and `auto`'s steady profiles
# in the simulator-validation job), `auto` measured the 2 MiB plan, whose trial windows spread
# widely, and kept dear, while as the benchmark's candidates the 1 MiB plan measured clearly
# faster than the 2 MiB one and than `auto` (the overlap benchmark's run of 2026-11-26, `auto`
# outside the benchmarks' tolerance of the fastest; figures: benchmarks/notes/README.md, 'Knob
# settings the simulator cannot order'). The two also
# run different credits, 2 and 4 MiB, which the simulator does not model (Note [Credit follows the
# partition] in sim/rank.py). So one more plan is measured, on top of the `auto_trials` runners-up:
# among the choice and the runners-up, the one whose policy's next knob setting is predicted closest
# to it, when within TIE_WINDOW (one, not one per policy: the trials already take 300-odd steps).
TIE_WINDOW = 0.02

# Note [Fewer copies break a tie]
# The simulator does not charge the engine's copies into and out of fusion buffers
# (plan/copies.py), and the knob settings of one policy differ mostly in them: under `dear` a
# 4 MiB threshold sends every large gradient in place, while 64 MiB fuses a few layers at a
# time and copies nearly every byte in and out. GPT-2 on 2 ranks at 4 Gbit/s: `auto` without
# trials saw dear at 4, 16 and 64 MiB within TIE_WINDOW of each other and picked 64 MiB by a
# hair in one run, 16 MiB in another, while 4 MiB measured clearly faster than 64 MiB in the
# benchmark's rounds, before and after fused host buffers were kept (Note [Host fusion buffers
# are kept] in csrc/buffer_pool.cpp; figures: benchmarks/notes/README.md, 'Fewer copies break a
# tie'). So among the leading policy's knob settings predicted within TIE_WINDOW of the leader,
# the one that copies fewest bytes leads; the trials still measure the leader it displaced
# (`knob_twin`). A tie is what the simulator cannot order; the copies are what it leaves out.
TRIAL_STEPS = 10
SWITCH_MARGIN = 0.01


def same_schedule(a: Ranked, b: Ranked) -> bool:
    """Whether two candidates run alike whatever their policies are called: the same blocks in
    the same order, the same update groups, mode and credit."""
    return (a.policy.overlaps_iterations == b.policy.overlaps_iterations
            and a.knobs.get("credit_bytes") == b.knobs.get("credit_bytes")
            and a.plan.blocks == b.plan.blocks and a.plan.update_groups == b.plan.update_groups)


def collectives_of(candidate: Ranked) -> frozenset[Collective]:
    return frozenset(block.op for block in candidate.plan.blocks)


def runners_up(ranked: list[Ranked], trials: int, window: float = TRIAL_WINDOW,
               cross_fit_window: float = CROSS_FIT_TRIAL_WINDOW) -> list[int]:
    """Indices into `ranked` of the candidates to measure after `ranked[0]`: the best-ranked
    one of each other policy predicted within `window` of it (`cross_fit_window` where its
    collectives differ from the leader's: Note [A prediction from another fit]), at most
    `trials`; a policy whose best runs a schedule already picked is covered by it (Note
    [Measuring the close calls]). The `baselines` come first, then the runners-up and an
    `overlap_baseline`, and a `knob_twin` last, on top of the `trials`."""
    if not ranked or trials == 0:
        return []
    baseline = baselines(ranked, cross_fit_window)
    picked = [ranked[0]] + [ranked[i] for i in baseline]
    seen = {candidate.policy for candidate in picked}
    leader = collectives_of(ranked[0])
    out: list[int] = []
    for index, candidate in enumerate(ranked[1:], start=1):
        if len(out) == trials:
            break
        allowed = window if collectives_of(candidate) == leader else cross_fit_window
        limit = ranked[0].predicted_s * (1.0 + allowed)
        if candidate.policy in seen or candidate.predicted_s > limit:
            continue
        seen.add(candidate.policy)
        if not any(same_schedule(candidate, other) for other in picked):
            picked.append(candidate)
            out.append(index)
    overlap = overlap_baseline(ranked, picked)
    picked += [ranked[i] for i in overlap]
    return baseline + out + overlap + knob_twin(ranked, [0, *out], picked)


def overlap_baseline(ranked: list[Ranked], picked: list[Ranked]) -> list[int]:
    """At most one index into `ranked`: its best overlap candidate, when `ranked[0]` and every
    plan `picked` to measure are synchronous (Note [A synchronous choice is measured against an
    overlap one])."""
    if any(candidate.policy.overlaps_iterations for candidate in picked):
        return []
    best = next((i for i, r in enumerate(ranked) if r.policy.overlaps_iterations), None)
    return [] if best is None else [best]


def knob_twin(ranked: list[Ranked], measured: list[int], picked: list[Ranked],
              window: float = TIE_WINDOW) -> list[int]:
    """At most one index into `ranked`: another knob setting of a `measured` candidate's
    policy predicted within `window` of it, the closest of them, running a schedule not
    `picked` yet (Note [Knob settings the simulator cannot order])."""
    best: tuple[float, int] | None = None
    for index in measured:
        original = ranked[index]
        twin = next((i for i, r in enumerate(ranked)
                     if r.policy == original.policy and i not in measured
                     and not any(same_schedule(r, other) for other in picked)), None)
        if twin is None:
            continue
        ratio = ranked[twin].predicted_s / original.predicted_s
        if ratio <= 1.0 + window and (best is None or ratio < best[0]):
            best = (ratio, twin)
    return [] if best is None else [best[1]]


def baselines(ranked: list[Ranked], window: float = CROSS_FIT_TRIAL_WINDOW) -> list[int]:
    """Indices into `ranked` of what every close call is measured against: the best
    synchronous candidate when `ranked[0]` is an overlap plan (Note [An overlap choice is
    measured against a synchronous one]), and the synchronous candidate with the fewest blocks
    when predicted within `window` of `ranked[0]` (Note [A quiet backward is measured too])."""
    synchronous = [i for i, r in enumerate(ranked) if not r.policy.overlaps_iterations]
    out = synchronous[:1] if ranked[0].policy.overlaps_iterations else []
    if synchronous:
        quiet = min(synchronous, key=lambda i: (len(ranked[i].plan.blocks), i))
        close = ranked[quiet].predicted_s <= ranked[0].predicted_s * (1.0 + window)
        # same_schedule covers the leader and the other baseline themselves and their twins.
        if close and not any(same_schedule(ranked[quiet], ranked[i]) for i in [0, *out]):
            out.append(quiet)
    return out


def trial_schedule(runners: list[int], rounds: int = TRIAL_ROUNDS) -> list[int]:
    """The order of the trial windows after the choice's (index 0) own check: every runner-up,
    then the choice, `rounds` times over (the last window runs the choice, which then stays
    installed if it is kept)."""
    if not runners:
        return []
    return (runners + [0]) * rounds


def measured_fastest(measured: dict[int, float], leader: int,
                     margin: float = SWITCH_MARGIN) -> int:
    """The index to keep: the fastest measured one when it beats `leader` by more than
    `margin`, else `leader`."""
    best = min(measured, key=lambda index: (measured[index], index))
    return best if measured[best] < measured[leader] * (1.0 - margin) else leader


def prefer_fewer_copies(ranked: list[Ranked], copies: Callable[[Plan], int],
                        window: float = TIE_WINDOW) -> list[Ranked]:
    """`ranked` with the leading policy's knob setting that copies fewest bytes (`copies` of
    its plan) moved to the front, among those predicted within `window` of `ranked[0]` (Note
    [Fewer copies break a tie]); ties in copies keep their order."""
    if not ranked:
        return ranked
    leader = ranked[0]
    limit = leader.predicted_s * (1.0 + window)
    # The leader is the first of them; min keeps the first of equal copies.
    tied = [(copies(r.plan), r) for r in ranked
            if r.policy == leader.policy and r.predicted_s <= limit]
    fewest, best = min(tied, key=lambda pair: pair[0])
    if fewest == tied[0][0]:
        return ranked
    return [best] + [r for r in ranked if r is not best]


def prefer_synchronous(ranked: list[Ranked], margin: float = OVERLAP_MARGIN) -> list[Ranked]:
    """`ranked` (fastest prediction first) with the best synchronous candidate moved to the
    front when the leading overlap candidate is not predicted faster than it by more than
    `margin` (Note [Overlap must win by a margin])."""
    if not ranked or not ranked[0].policy.overlaps_iterations:
        return ranked
    sync = next((r for r in ranked if not r.policy.overlaps_iterations), None)
    if sync is None or sync.predicted_s > ranked[0].predicted_s * (1.0 + margin):
        return ranked
    return [sync] + [r for r in ranked if r is not sync]
