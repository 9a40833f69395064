"""A session's side of elastic Horovod (Note [Elastic Horovod] in world/bootstrap.py): whether
its world went stale, re-binding to the world of now, and forgetting a failed iteration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..world import World, bootstrap
from .engine import EngineHandle


class ElasticBinding:
    """Mixed into Session, which provides `_bind()` (everything that needs the world) and
    `_reset_counts()` (the iteration-local counts)."""

    elastic: bool
    world: World
    engine: EngineHandle
    _bound: bool
    _gradients_started: bool

    def _bind(self) -> None:
        raise NotImplementedError

    def _reset_counts(self) -> None:
        raise NotImplementedError

    @property
    def stale(self) -> bool:
        """Whether this session must (re)bind before its next collective: never bound, or its
        world is broken or was re-formed (an elastic job only)."""
        return self.elastic and (not self._bound or bootstrap.stale()
                                 or self.world is not bootstrap.world())

    def _rebind(self) -> None:
        """Stops this session's engine (its world failed or changed) and binds to the world of
        now, with a plan for its size; the iteration-local counts start over."""
        if self._bound:
            self.engine.shutdown()  # no wait: its collectives may have failed
        self._bound = False
        self._abandon_iteration()
        self._bind()

    def _abandon_iteration(self) -> None:
        """Forgets the gradients handed over in an iteration that failed: Horovod's elastic loop
        restores the last commit and runs the iteration again."""
        self._reset_counts()
        self._gradients_started = False

    def _elastic_guard(self, call: Callable[..., None], *args: Any) -> None:
        """Runs `call(*args)`; in an elastic job a failure first abandons the iteration, so that
        the restored run starts it clean."""
        try:
            call(*args)
        except RuntimeError:
            if self.elastic:
                self._abandon_iteration()
            raise

    @property
    def elastic_state_step(self) -> bool:
        """Whether step() is Horovod's state initialisation of an elastic sync: an optimizer with
        no state yet steps once on zero gradients, on the ranks that lack state only (a joining
        worker), outside any iteration. Horovod's own optimizer steps locally there, and so does
        this one: no gradient was handed over and the world is not yet formed for this run."""
        return self.elastic and not self._gradients_started and self.stale
