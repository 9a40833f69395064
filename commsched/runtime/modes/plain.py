"""The plain mode: a world of one that has settled on its plan steps as the plain optimizer:
no gradient hook, no engine wait, no deferred update.

Note [A world of one steps as the plain optimizer]
With no peer there is nothing to reduce, and Horovod's optimizer registers no gradient hook at
size 1: it costs what the plain optimizer costs. Ours hands every gradient to the engine and
waits for it at step(), which is what lets a world of one be profiled (a profile to simulate
larger worlds from, `auto`'s choice) but costs a hook per gradient and a wait per step
(measured on GPT-2's 148 tensors on a core here in benchmarks/overhead/gpt2_layout_cpu/README.md).
Once nothing is left to learn, that cost buys nothing. So when the plan has settled and its
closely sampled iterations are over (the profile then describes it: Note [Sampling the profile]
in planning/lifecycle.py), a session with no peer removes its gradient hooks (and torch's hook
object with them: Note [An empty hook dict still costs a call] in csrc/gradient_intake.cpp) and from
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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .base import ModeKind, StepRules
from .synchronous import SynchronousMode

if TYPE_CHECKING:
    from ...config import Config
    from ...world import World


class PlainMode(SynchronousMode):
    """The user's optimizer and nothing else; the session counts the iteration. It also keeps
    whether a session may still pass through (StepModes.maybe_pass_through switches to it)."""

    kind = ModeKind.PLAIN

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        # Whether passing through may still come: false once some iteration lacked a gradient,
        # and from the start where the world or the options rule it out (set at each bind).
        self.possible = False

    def decide_at_bind(self, world: World, elastic: bool, routed: bool, hook_works_alone: bool,
                       config: Config) -> None:
        """At bind: whether this session could ever step as the plain optimizer."""
        self.possible = (world.size == 1 and not elastic and not routed
                         and not hook_works_alone and not config.timeline)

    def lacked_gradient(self) -> None:
        """Some gradient was missing at step(): this session steps through the engine for good."""
        self.possible = False

    def first_gradient(self) -> None:
        """Not called: no hook hands a gradient over."""

    def synchronize(self) -> None:
        self.session.state.iteration += 1

    def update(self, step: Callable[[], Any], closure: Any) -> Any:
        return step()

    def skip_update(self) -> None:
        """Nothing was timed: nothing ends."""

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        if not protocol.reduces:
            return super().step(optimizer, protocol, synchronize, closure)
        # What synchronize() and update() would do here, without their calls.
        self.session.state.iteration += 1
        return self.session.deferred.base_step(optimizer, closure)
