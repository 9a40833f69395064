"""A world of one that has settled on its plan steps as the plain optimizer: no gradient hook,
no engine wait, no deferred update (Note [A world of one steps as the plain optimizer]).

Note [A world of one steps as the plain optimizer]
With no peer there is nothing to reduce, and Horovod's optimizer registers no gradient hook at
size 1: it costs what the plain optimizer costs. Ours hands every gradient to the engine and
waits for it at step(), which is what lets a world of one be profiled (a profile to simulate
larger worlds from, `auto`'s choice) but costs a hook per gradient and a wait per step
(measured on GPT-2's 148 tensors on a core here in benchmarks/overhead/gpt2_layout_cpu/README.md).
Once nothing is left to learn, that cost buys nothing. So when the plan has settled and its
closely sampled iterations are over (the profile then describes it: Note [Sampling the profile]
in sampling.py), a session with no peer removes its gradient hooks (and torch's hook object
with them: Note [An empty hook dict still costs a call] in csrc/gradient_intake.cpp) and from
then on step() counts the iteration and calls the user's optimizer, and nothing else. Only
where that changes nothing the user can see:
  * one world of one, for good: not in an elastic job (a world that may grow again);
  * no overlap runner recording the forward order (the profiling steps). An overlap plan
    (bytescheduler, prophet, dear) has nothing to overlap without a peer, and its runner's cost
    (a pre-hook per group start, the gradients taken out of p.grad, one optimizer call per
    group) bought nothing there: at the switch the runner applies the updates it holds, at
    once, and stands down, and from then on each update is made at step(). A deferred update
    is the update step() would have made (with the hyper-parameters of that step(): see
    deferred.py), so the parameters are the same, only current sooner:
    what flush() is for is then true after every step(). The plan stays the overlap one
    (optimizer.plan, checkpoints, what-if profiles);
  * no timeline being written, no compressor (its error feedback runs in a world of one too),
    no sparse route, backward_passes_per_step 1 (the hooks count the passes);
  * every parameter had its gradient in every iteration so far: where one lacked it, the
    synchronous step fills it with zeros (Horovod's rule for a gradient another rank may have
    made), which a plain step would not; the first such iteration ends the prospect for good.
Whatever changes the plan or the passes hooks the gradients again first
(set_backward_passes_per_step, load_state_dict), and puts an overlap plan's runner back to
work: the engine then finds the next iteration as any other, and step() hands over what no
hook did (GradientHooks.launch_rest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import _C

if TYPE_CHECKING:
    from ..config import Config
    from ..world import World
    from .compressed import CompressedGradients
    from .gradient_hooks import GradientHooks
    from .lifecycle import PlanLifecycle
    from .overlap import OverlapRunner


class PassThrough:
    """Held by a Session: whether its step() is the plain optimizer's now, and whether that may
    still come. The session hands in what it holds at each call (the world, the runner and the
    lifecycle change when an elastic job re-binds)."""

    def __init__(self) -> None:
        # Whether step() is the plain optimizer's now.
        self.active = False
        # Whether that may still come: false once some iteration lacked a gradient, and from
        # the start where the world or the options rule it out (set at each bind).
        self.possible = False
        # Whether passing through stood an overlap plan's runner down (resume puts it back).
        self.runner_resting = False

    def decide_at_bind(self, world: World, elastic: bool, routed: bool,
                       compressed: CompressedGradients | None, config: Config) -> None:
        """At bind: whether this session could ever step as the plain optimizer."""
        self.possible = (world.size == 1 and not elastic and not routed
                         and compressed is None and not config.timeline)

    def maybe_start(self, passes: int, lifecycle: PlanLifecycle, runner: OverlapRunner | None,
                    hooks: GradientHooks, params: list[torch.Tensor]) -> None:
        """At the end of an iteration's step(): removes the gradient hooks, and stands an
        overlap plan's runner down, where nothing is left to learn (Note [A world of one steps
        as the plain optimizer])."""
        if not self.possible or passes != 1 or not lifecycle.sampling.rarely \
                or lifecycle.restore_unchecked or (runner is not None and runner.recording):
            return
        if runner is not None and runner.active:
            runner.finish()  # the updates it holds, made now rather than in the next forward
            runner.deactivate()
            self.runner_resting = True
        hooks.remove_dense(params)
        self.active = True

    def lacked_gradient(self) -> None:
        """Some gradient was missing at step(): this session steps through the engine for good."""
        self.possible = False

    def resume(self, hooks: GradientHooks, intake: _C.GradientIntake, params: list[torch.Tensor],
               runner: OverlapRunner | None, lifecycle: PlanLifecycle) -> None:
        """Leaves the plain optimizer's step: the gradients go to the engine again from the next
        one handed over (a gradient already in ``p.grad`` goes at step())."""
        if self.active:
            hooks.restore_dense(intake, params)
            self.active = False
        if self.runner_resting:
            assert runner is not None
            runner.activate(lifecycle.plan)
            self.runner_resting = False

    def overlap_plan_runs(self, runner: OverlapRunner | None) -> bool:
        """Whether the plan in place defers updates to the next forward pass, resting or not
        (what a checkpoint saves: the run it restores hooks its gradients again)."""
        return runner is not None and (runner.active or self.runner_resting)
