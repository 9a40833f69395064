"""The overlap mode (cross-iteration): step() launches the rest and returns; the overlap runner
(runtime/modes/overlap/runner.py) applies each group's update in the next forward pass
(bytescheduler, prophet, dear, and `auto`'s choice of one). And whether a wrapped model and
optimizer can run it at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ....torch_compat import compiled_fullgraph
from ..base import ModeKind, StepRules
from ..synchronous import SynchronousMode

if TYPE_CHECKING:
    from .runner import OverlapRunner


class OverlapMode(SynchronousMode):
    kind = ModeKind.OVERLAP
    defers_updates = True

    @property
    def runner(self) -> OverlapRunner:
        runner = self.session.modes.runner
        assert runner is not None, "an overlap mode runs with the runner that applies it"
        return runner

    def first_gradient(self) -> None:
        session, runner = self.session, self.runner
        if runner.open:  # no forward pass of `model` closed the previous iteration: do it now
            runner.finish(after_forward=True)
        if session.engine.sampling:
            session.clock.first_gradient(runner.update_seconds_so_far())

    def step(self, optimizer: torch.optim.Optimizer, protocol: StepRules,
             synchronize: Callable[[], None], closure: Any) -> Any:
        if not protocol.reduces:  # after synchronize(): every gradient is final, update now
            return super().step(optimizer, protocol, synchronize, closure)
        if closure is not None:
            raise ValueError(f"commsched: policy '{self.session.config.policy.value}' defers "
                             "the update to the next forward pass and cannot run a closure")
        self.step_deferred()
        return None

    def step_deferred(self) -> None:
        """Launches the rest and leaves the update to the next forward pass. Its waits
        (PowerSGD's second round) may fail as synchronize()'s may: ElasticGuard.run."""
        self.session.guarded(self._step_deferred)

    def _shard_step(self) -> Callable[[Callable[[int], torch.Tensor]], float] | None:
        """What updates this rank's slices before the all-gathers go (the sharded variant's)."""
        return None

    def _step_deferred(self) -> None:
        session, runner = self.session, self.runner
        session.publish("step")
        session.vote.cast(session.state.iteration)  # where no gradient came in this iteration
        runner.finish()  # where no backward came since the last step(); else it holds nothing
        if session.state.restore_unchecked:
            session.lifecycle.check_restored(session.state.iteration)
        session.launch_rest()
        shard_step = self._shard_step()
        runner.gathers_parameters = shard_step is not None
        runner.begin(shard_step)
        session.engine.comm_hook.deferred_round(session.plan, runner.release_for)
        # Sparse rows are few and updated now, at step(), while dense blocks are deferred.
        if session.routed:
            session.sparse.exchange()
            session.sparse.step_now(session.deferred)
        if runner.guard.updates_at_step:  # a forward path that runs no hook: nothing pending
            runner.finish()
        session.end_iteration()
        update_s = runner.take_update_seconds()
        if session.engine.sampling:
            session.engine.profiler.note("step_s", update_s)
        session.clock.step_ended()
        session.publish("forward")
        session.end_of_step()

    def finish(self) -> None:
        self.runner.finish()


# Optimizers whose step needs every gradient at once: they cannot be split into per-block updates.
_UNSPLITTABLE = (torch.optim.LBFGS,)


# Note [Module hooks under torch.compile]
# An overlap plan's updates run in forward pre-hooks (and the profiling steps time each module
# with hooks). Inside a compiled forward pass dynamo would trace into them: an optimizer step,
# clocks and the engine's waits, which it cannot trace (it failed on the update's param-group
# views). Every such hook is registered through torch_compat.eager_hook, so dynamo breaks the
# graph at the hook and runs it eagerly: at most one break per module whose pre-hook applies an
# update group (where a group starts, and the first user of each of its parameters: Note
# [Skipped group starts]; OverlapRunner.hooked_modules), and at modules in the forward passes
# that record module times (the profiling steps, then the sampled ones). The breaks counted on
# the built-in Transformer are in benchmarks/compile/. A model compiled with fullgraph=True
# forbids graph breaks, so there the overlap policies are refused at wrap time and `auto` plans
# synchronous policies only.
def overlap_possible(model: Any, base_cls: type) -> bool:
    return isinstance(model, torch.nn.Module) and not issubclass(base_cls, _UNSPLITTABLE) \
        and not compiled_fullgraph(model)


def check_overlap_allowed(policy_name: str, model: Any, base_cls: type) -> None:
    if model is None or not isinstance(model, torch.nn.Module):
        raise ValueError(f"commsched: policy '{policy_name}' applies each update in the next "
                         "forward pass and needs the model: DistributedOptimizer(..., model=model)")
    if compiled_fullgraph(model):
        raise ValueError(f"commsched: policy '{policy_name}' applies each update in a forward "
                         "pre-hook, which breaks the graph, and the model was compiled with "
                         "torch.compile(..., fullgraph=True), which forbids graph breaks; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous, no hooks in forward), "
                         "or compile without fullgraph=True")
    if issubclass(base_cls, _UNSPLITTABLE):
        raise ValueError(f"commsched: {base_cls.__name__} needs all gradients at once and cannot "
                         f"be split into per-block updates as policy '{policy_name}' does; use "
                         "policy='horovod', 'ddp' or 'mgwfbp' (synchronous)")
