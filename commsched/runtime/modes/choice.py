"""Which step mode a session runs now: the one its plan asks for, or the plain one while a world
of one passes through (Note [A step mode is an object] in base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...plan import Plan
from .base import StepMode
from .overlap.mode import OverlapMode
from .plain import PlainMode
from .sharded import ShardedMode, ShardedOverlapMode
from .synchronous import SynchronousMode

if TYPE_CHECKING:
    from .base import ModeSession
    from .overlap.runner import OverlapRunner


class StepModes:
    """Held by a ModeSession: one object per mode, the one that runs, and the overlap runner that
    the overlap modes drive (made at each bind where the model may overlap: binding.py). The
    plan's lifecycle calls `follow` and `shard` as it installs plans; the session calls
    `maybe_pass_through` and `resume`."""

    def __init__(self, session: ModeSession) -> None:
        self._synchronous = SynchronousMode(session)
        self._overlap = OverlapMode(session)
        self._sharded = ShardedMode(session)
        self._sharded_overlap = ShardedOverlapMode(session)
        self.plain = PlainMode(session)
        self._session = session
        # The runner of this bind's world: it records the forward order during the profiling
        # steps and applies an overlap plan's updates; None where no plan can overlap.
        self.runner: OverlapRunner | None = None
        self._shards = False  # whether the installed plan is sharded
        self._overlaps = False  # whether the installed plan defers its updates (the runner's)
        # The mode the installed plan asks for, and the one that runs (planned, or plain).
        self.planned: StepMode = self._synchronous
        self.current: StepMode = self._synchronous

    def bind(self, runner: OverlapRunner | None) -> None:
        """A new world's parts: its runner (recording), no plan installed yet."""
        self.runner, self._shards, self._overlaps = runner, False, False
        self._choose()

    def unbind(self) -> OverlapRunner | None:
        """Removes the runner's hooks with what it still defers; returns it (its recorded
        forward order serves the next bind's runner)."""
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.remove()
        self._shards = self._overlaps = False
        self._choose()
        return runner

    # -- the lifecycle, as it installs plans --------------------------------------------------

    def follow(self, plan: Plan, overlaps: bool) -> None:
        """The installed `plan` defers its updates (`overlaps`) or not; without a runner, every
        plan is synchronous."""
        runner = self.runner
        if runner is None:
            return
        if overlaps:
            runner.activate(plan)
        else:
            runner.deactivate()
        self._overlaps = overlaps
        self._choose()

    def restore(self, order: list[str], overlaps: bool, recording: bool, plan: Plan) -> None:
        """Puts the runner where a checkpoint left it (OverlapRunner.restore)."""
        if self.runner is not None:
            self.runner.restore(order, overlaps, recording, plan)
            self._overlaps = overlaps
            self._choose()

    def shard(self, sharded_plan: bool) -> None:
        """The installed plan is sharded (shard_optimizer past the profiling steps) or not."""
        self._shards = sharded_plan
        self._choose()

    def _choose(self) -> None:
        if self._shards:
            self.planned = self._sharded_overlap if self._overlaps else self._sharded
        else:
            self.planned = self._overlap if self._overlaps else self._synchronous
        if self.current is not self.plain:
            self.current = self.planned

    def finish(self) -> None:
        """Applies every update the mode in place still holds."""
        self.current.finish()

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the runner: whether the plan defers its updates (resting
        or not: the run it restores hooks its gradients again), whether it records, and the
        forward order it observed; None without a runner."""
        runner = self.runner
        if runner is None:
            return None
        return {"active": self.planned.defers_updates, "recording": runner.recording,
                "order": list(runner.modules.order)}

    # -- a world of one passing through (Note [A world of one steps as the plain optimizer]) --

    def maybe_pass_through(self) -> None:
        """At the end of an iteration's step(): removes the gradient hooks, and stands an
        overlap plan's runner down, where nothing is left to learn."""
        session, runner = self._session, self.runner
        lifecycle = session.lifecycle
        if not self.plain.possible or session.accumulation.passes != 1 \
                or not lifecycle.sampling.rarely or session.state.restore_unchecked \
                or (runner is not None and runner.recording):
            return
        if runner is not None and runner.active:
            runner.finish()  # the updates it holds, made now rather than in the next forward
            runner.deactivate()
        session.hooks.remove_dense(session.params)
        self.current = self.plain

    def resume(self) -> None:
        """Leaves the plain optimizer's step: the gradients go to the engine again from the next
        one handed over (a gradient already in ``p.grad`` goes at step())."""
        if self.current is not self.plain:
            return
        session = self._session
        session.hooks.restore_dense(session.accumulation.intake, session.params)
        self.current = self.planned
        if self.planned.defers_updates:
            assert self.runner is not None
            self.runner.activate(session.lifecycle.plan)
