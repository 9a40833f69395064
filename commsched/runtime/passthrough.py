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
hook did (Session._launch_rest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import _C

if TYPE_CHECKING:
    from ..config import Config
    from ..world import World
    from .compressed import CompressedGradients
    from .lifecycle import PlanLifecycle
    from .overlap import OverlapRunner


class Passthrough:
    """Mixed into Session, which provides the world, the hooks and what decides whether the
    plan has settled."""

    world: World
    config: Config
    elastic: bool
    params: list[torch.Tensor]
    intake: _C.GradientIntake | None
    compressed: CompressedGradients | None
    runner: OverlapRunner | None
    lifecycle: PlanLifecycle
    passes: int
    iteration: int
    _routed: list[tuple[str, torch.Tensor]]
    _hooks: list[Any]
    _hooked: int

    # Whether step() is the plain optimizer's now, and whether that may still come: false once
    # some iteration lacked a gradient, and from the start where the world or the options rule
    # it out (Note [A world of one steps as the plain optimizer]).
    passthrough = False
    _may_pass = False
    # Whether passing through stood an overlap plan's runner down (hook_gradients puts it back).
    _runner_resting = False

    def _gradient_hooks(self) -> list[Any]:
        """The dense parameters' hooks, which hand each gradient to the intake."""
        assert self.intake is not None
        return [p.register_post_accumulate_grad_hook(self.intake.hook(tid))
                for tid, p in enumerate(self.params) if p.numel() > 0]

    def _passthrough_possible(self) -> bool:
        """At bind: whether this session could ever step as the plain optimizer."""
        return (self.world.size == 1 and not self.elastic and not self._routed
                and self.compressed is None and not self.config.timeline)

    def _maybe_pass_through(self) -> None:
        """At the end of an iteration's step(): removes the gradient hooks, and stands an
        overlap plan's runner down, where nothing is left to learn (Note [A world of one steps
        as the plain optimizer])."""
        runner = self.runner  # called from step(), never while passing through
        if self.passes != 1 or not self.lifecycle.sampling.sparse or self.lifecycle.unsettled \
                or (runner is not None and runner.recording):
            return
        if runner is not None and runner.active:
            runner.finish()  # the updates it holds, made now rather than in the next forward
            runner.deactivate()
            self._runner_resting = True
        for handle in self._hooks[:self._hooked]:
            handle.remove()
        # Note [An empty hook dict still costs a call] (csrc/gradient_intake.cpp): where no
        # other hook is left (the user's own stay), torch's hook object goes too.
        emptied = [p for p in self.params if p._post_accumulate_grad_hooks is not None
                   and not p._post_accumulate_grad_hooks]
        for param in emptied:
            param._post_accumulate_grad_hooks = None  # type: ignore[assignment]
        _C.drop_post_accumulate_grad_hooks(emptied)
        self.passthrough = True

    def _lacked_gradient(self) -> None:
        """Some gradient was missing at step(): this session steps through the engine for good."""
        self._may_pass = False

    def hook_gradients(self) -> None:
        """Leaves the plain optimizer's step: the gradients go to the engine again from the next
        one handed over (a gradient already in ``p.grad`` goes at step())."""
        if self.passthrough:
            self._hooks[:self._hooked] = self._gradient_hooks()
            self.passthrough = False
        if self._runner_resting:
            assert self.runner is not None
            self.runner.activate(self.lifecycle.plan)
            self._runner_resting = False

    @property
    def overlap_plan_runs(self) -> bool:
        """Whether the plan in place defers updates to the next forward pass, resting or not
        (what a checkpoint saves: the run it restores hooks its gradients again)."""
        runner = self.runner
        return runner is not None and (runner.active or self._runner_resting)

    def never_pass_through(self) -> None:
        """Keeps this session stepping through the engine and, under an overlap plan, its
        runner in a world of one: commsched.bench.overhead measures the runtime's own cost
        this way, as a world with peers pays it."""
        self.hook_gradients()
        self._may_pass = False
