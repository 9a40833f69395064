"""Uneven inputs (commsched.join, commsched.Join): each iteration's vote of which ranks still
have a batch, and the iteration a rank out of batches runs to answer its peers'.

Note [Answering the others' collectives]
A plan's collectives pair across ranks by their order, so a rank that runs out of batches while
the others go on leaves each of theirs waiting until the timeout. With uneven inputs on, every
iteration begins with a vote: one all-reduce, on the world's control group, of a vector with a
slot per rank, 1 where the rank has a batch. An active rank casts it at its iteration's first
gradient, before any collective of the iteration (a restore's comparison, the first block), or
at step()/synchronize() where no gradient came; once per iteration. A rank that has joined
casts 0, and while any slot is 1 it runs one iteration of its own with no gradient, through the
same calls as its peers' (the first-gradient call, step(), and under an overlap plan flush()):
every block goes with zeros, as a gradient a rank did not produce does (Horovod's rule), and its
optimizer steps on the average. So the plan's collectives, a re-plan's and `auto`'s messages pair
as they would. When every slot is 0 every rank has joined, and all leave together. The mean
divides by the whole world, as DDP's Join does by default (divide_by_initial_world_size), and
the joined ranks' parameters and optimizer state follow the others' step for step: every rank
ends with what the last to join holds. Not answered: a collective the script makes on its own
tensors inside the loop (the mean of a metric), which is made after the join instead; and a
second wrapped optimizer, whose votes would interleave with the first's by the script's order.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..world import World, registry
from ..world.errors import without_backtrace


class NoVote:
    """A session without uneven inputs: its iterations cast nothing."""

    voting = False

    def cast(self, iteration: int) -> list[int]:
        """Nothing is cast; every rank counts as active."""
        del iteration
        return []


class StepVote:
    """A session's votes while uneven inputs are on (Note [Answering the others' collectives])."""

    voting = True

    def __init__(self, world: World) -> None:
        self._world = world
        self.joined = False  # this rank is out of batches: it casts 0
        self.cast_at = -1  # the iteration whose vote was cast last
        # The ranks that had a batch at the last vote where any had one: the last to join.
        self.last_active: list[int] = list(range(world.size))

    def cast(self, iteration: int) -> list[int]:
        """Casts this rank's vote for `iteration`, once; returns the ranks that have a batch.

        Raises:
            RankFailureError: the vote failed or timed out (COMMSCHED_TIMEOUT): a peer died,
                or went on to a collective no rank answers; the message names it.
        """
        if iteration == self.cast_at:
            return self.last_active
        self.cast_at = iteration
        world = self._world
        if world.size == 1:
            return [] if self.joined else [world.global_rank(0)]
        slots = torch.zeros(world.size, dtype=torch.int32)
        slots[world.rank] = 0 if self.joined else 1
        activity = registry.activity
        previous = activity.now
        activity.now = ("collective", time.monotonic(), iteration)
        try:
            dist.all_reduce(slots, group=world.control_group)
        except RuntimeError as err:
            liveness = world.liveness
            verdict = liveness.diagnose(ranks=world.members).text if liveness is not None else ""
            raise world.fail(f"{verdict + ': ' if verdict else ''}commsched: the vote of "
                             f"iteration {iteration} of uneven inputs (commsched.join) failed: "
                             f"{without_backtrace(err)}") from None
        finally:
            activity.now = previous
        active = [world.global_rank(r) for r, slot in enumerate(slots.tolist()) if slot]
        if active:
            self.last_active = active
        return active
