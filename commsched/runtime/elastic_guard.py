"""A session's side of elastic Horovod (Note [Elastic Horovod] in world/bootstrap.py): what an
elastic job refuses at wrap time, and the ElasticGuard that re-binds a session whose world was
re-formed and forgets an iteration that failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config

if TYPE_CHECKING:
    from .intake.gradient_intake import Accumulation
    from .world_binding import WorldBinding


def refuse_in_elastic_job(config: Config) -> None:
    """Raises ValueError for what an elastic Horovod job cannot restore after losing a worker."""
    if config.shard_optimizer:
        raise ValueError("commsched: shard_optimizer=True (COMMSCHED_SHARD_OPTIMIZER) does not "
                         "run in an elastic Horovod job yet: each rank holds the optimizer "
                         "state of its slices only, which would be lost with a worker and would "
                         "have to move to the re-formed world's slices; leave it off there")
    if config.uneven_inputs:
        raise ValueError("commsched: uneven_inputs=True (COMMSCHED_UNEVEN_INPUTS) does not run "
                         "in an elastic Horovod job: its votes pair ranks by their iterations, "
                         "which a lost worker's rollback changes; leave it off there")


# Note [Elastic Horovod and deferred updates]
# An overlap plan leaves each step()'s update to the next forward pass. Horovod's elastic loop
# saves its state at state.commit(): TorchState reads model.state_dict() first, whose pre-hooks
# apply what the runner defers (Note [The last deferred update] in overlap/runner.py), and the
# optimizer's state_dict() flushes too, so a commit never holds half an update. After a failure
# Horovod restores the commit (the model's and the optimizer's load_state_dict()), re-forms the
# world and broadcasts rank 0's state, loading it once more. What the runner still defers at a
# restore belongs to the iterations rolled back, and its collectives may never complete (a peer
# is gone): applying it would wait for them and then overwrite nothing the restore keeps. So in
# an elastic job load_state_dict() unbinds the session instead of flushing: the engine stops
# without waiting, the runner's hooks go with its pending updates, and the next iteration's first
# gradient binds to the world of now, with a new runner that profiles and plans for its size
# (`auto` decides again). A forward pass between the two runs no hook: nothing is pending.
# Horovod's other load, its sync after a host was added, follows a commit: nothing is pending
# then either, and the world re-forms at the next step anyway.

# Note [Elastic Horovod and process sets]
# A process set names global ranks, and an elastic job numbers its ranks anew at each re-form.
# The set is read again in each world the job forms (WorldBinding.bind): it holds the ranks of
# that number now, whichever workers they are, and a rank outside it steps on its local
# gradients, as in any job. The workers of a re-formed world start from rank 0's state (Horovod's
# sync), so nothing a former member or non-member did is carried over. A set that names a rank
# the new world lacks is refused at that bind (a ValueError naming the set and the size). A
# failed collective of the set's view marks the whole world broken, whose groups the view's were
# made in: the next step re-forms it. The iteration a joining worker starts from is rank 0's of
# the whole world, member or not.

# Note [Elastic Horovod and compressor state]
# PowerSGD and top-k keep state per rank: the error-feedback residuals (top-k under momentum
# SGD: DGC's velocities) and PowerSGD's warm-start Q. A rank's residual is what its own messages
# left out; it means nothing to another rank, and a lost worker takes its own with it. After a
# re-form the ranks are numbered anew, so no rank can take over another's. Each bind (the first
# step, and every re-formed world) therefore makes a new compressor: residuals and velocities
# zero, Q at its seeded start, the same on every rank. The committed parameters and optimizer
# state are restored as under every policy; only what the compressors had not yet sent is
# dropped, as when a run starts. (A restore loads no compressor state: load_state_dict() unbinds
# first, and the next bind starts afresh.) tests/jobs/elastic_job.py replays each rank's
# compressor from zero at every bind and ends where the job ends.


class ElasticGuard:
    """Held by a Session, and idle outside an elastic Horovod job (WorldBinding.elastic says
    which). Horovod's elastic loop restores the last commit after a failure and runs the
    iteration again, in a world that may have been re-formed meanwhile."""

    def __init__(self, binding: WorldBinding, accumulation: Accumulation) -> None:
        self._binding, self._accumulation = binding, accumulation

    def run(self, call: Callable[..., None], *args: Any) -> None:
        """Runs `call(*args)`; in an elastic job a failure first forgets the gradients handed
        over in this iteration, so that the restored run starts it clean."""
        try:
            call(*args)
        except RuntimeError:
            if self._binding.elastic:
                self._accumulation.start_over()
            raise

    def rebind_if_stale(self, bind: Callable[[], None]) -> None:
        """Before the iteration's first collective: where the session's world broke or was
        re-formed (WorldBinding.stale), stops its engine and binds to the world of now with
        `bind`, which plans for that world's size; the iteration's counts start over."""
        if self._binding.stale:
            self.run(self._rebind, bind)

    def _rebind(self, bind: Callable[[], None]) -> None:
        self._binding.unbind()
        self._accumulation.start_over()
        bind()

    @property
    def state_step(self) -> bool:
        """Whether step() is Horovod's state initialisation of an elastic sync: an optimizer with
        no state yet steps once on zero gradients, on the ranks that lack state only (a joining
        worker), outside any iteration. Horovod's own optimizer steps locally there, and so does
        this one: no gradient was handed over and the world is not yet formed for this run."""
        return self._binding.elastic and not self._accumulation.started and self._binding.stale
