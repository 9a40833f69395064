"""The state of the iteration in progress, declared once (Note [One iteration's state]).

Note [One iteration's state]
What describes the iteration in progress, rather than the run or the plan, is one object a
session holds and hands to the parts that act on it, as DDP's reducer declares its buckets and
counters in one place. Everything else an iteration touches is the state of one part, kept
there because nobody else reads it:
  * the gradient intake's counts (passes per tensor, gradients handed over, whether the first
    gradient came and whether no_sync() holds the intake): C++, csrc/gradient_intake.h;
  * an overlap plan's pending updates (which groups and slots still wait for the next forward
    pass, the gradients taken out of p.grad): the runner's, Note [Stamps, not sets] in
    modes/overlap/runner.py;
  * whether the profiler records this iteration: the engine handle's `sampling`, which the
    plan's sampling schedule sets (Note [Sampling the profile] in planning/lifecycle.py);
  * the uneven-inputs vote of the iteration: step_vote.py's StepVote.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IterationState:
    # The iterations completed: what the heartbeats, the timeline, the plan's re-plan points and
    # checkpoints count, and what the engine stamps on its blocks (through a weak reference).
    iteration: int = 0
    # Whether no_sync() left gradients in p.grad that no step() has averaged yet: zero_grad()
    # drops them with a warning (Accumulation.no_sync sets it, every end of an iteration clears
    # it).
    held_back: bool = False
    # Tensor ids whose gradient arrived sparse on a dense-planned parameter in this iteration:
    # reduced dense and handed back sparse after the wait (Note [sparse gradients without a
    # route] in intake/gradient_intake.py).
    densified: set[int] = field(default_factory=set)
    # Whether a plan or position restored by load_state_dict() awaits the ranks' comparison
    # before the iteration's first collective (PlanLifecycle.check_restored); callers test it
    # before calling, so that a plain iteration spends no call on it.
    restore_unchecked: bool = False
