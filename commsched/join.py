"""Uneven inputs: ``join()`` (Horovod's ``hvd.join()``) and ``Join`` (DDP's context manager).

A rank that runs out of batches before the others joins: it answers their iterations'
collectives with zeros until every rank has joined (Note [Answering the others' collectives] in
runtime/step_vote.py). Then every rank takes the parameters of the last rank to join, as DDP's
Join does, and all go on together.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .runtime.step_vote import NoVote, StepVote
from .world.errors import elastic

if TYPE_CHECKING:
    from .optimizer import _DistributedOptimizer
    from .runtime.session import Session


def _wrapped(optimizer: Any) -> _DistributedOptimizer:
    session = getattr(optimizer, "session", None)
    if session is None or not hasattr(session, "vote"):
        raise TypeError("commsched.join: pass the optimizer that commsched.DistributedOptimizer "
                        f"returned, got {type(optimizer).__name__}")
    if elastic():
        raise ValueError("commsched.join: uneven inputs do not run in an elastic Horovod job: "
                         "its votes pair ranks by their iterations, which a lost worker's "
                         "rollback changes")
    return optimizer  # type: ignore[no-any-return]


def _answer_one_iteration(optimizer: _DistributedOptimizer) -> None:
    """An iteration with no gradient, through the calls of a peer's.

    Every block goes with zeros, the optimizer steps on the average (Note [Answering the
    others' collectives]).
    """
    session: Session = optimizer.session
    optimizer.zero_grad(set_to_none=True)
    session.first_gradient()
    optimizer.step()
    optimizer.flush()


def _join(optimizer: _DistributedOptimizer, model: torch.nn.Module | None) -> int:
    session: Session = optimizer.session
    vote = session.vote
    assert isinstance(vote, StepVote)
    world = session.world
    if world.size == 1:
        return world.global_rank(0)
    optimizer.flush()  # this rank's last update, whose blocks the others answer
    vote.joined = True
    try:
        while vote.cast(session.state.iteration):
            _answer_one_iteration(optimizer)
    finally:
        vote.joined = False
        vote.cast_at = -1  # the all-zero vote began no iteration: the next one votes again
    last = max(vote.last_active)  # a global rank
    tensors = [p.data for p in session.names]
    if model is not None:
        tensors += [b.data for b in model.buffers()]
    for tensor in tensors:  # every rank ends with the last joiner's model, as under DDP's Join
        dist.broadcast(tensor, src=last, group=world.process_group)
    return last


def join(optimizer: Any, model: torch.nn.Module | None = None) -> int:
    """Ends this rank's epoch early: answers the others' iterations until every rank joined.

    Horovod's ``hvd.join()``: call it on every rank after its last batch, where the ranks hold
    uneven numbers of batches. Until every rank has called it, this one runs an iteration with
    no gradient for each of the others' (its blocks go with zeros, its optimizer steps on the
    average, which divides by the whole world as DDP's Join does); then every rank takes the
    last joiner's parameters (and `model`'s buffers). It needs ``uneven_inputs=True`` (or
    COMMSCHED_UNEVEN_INPUTS=1) on every rank's wrap, which makes each iteration vote first;
    ``with commsched.Join(optimizer):`` around the loop needs no knob. Without either, a rank
    out of batches leaves the others waiting until COMMSCHED_TIMEOUT, whose error names it.
    Reduce metrics (commsched.allreduce) after the join, not inside the loop: a rank that has
    joined answers the optimizer's collectives only.

    Args:
        optimizer: the wrapped optimizer (what commsched.DistributedOptimizer returned).
        model: the model, whose buffers (BatchNorm's statistics) are taken from the last
            joiner too; None: the parameters only.

    Returns:
        The global rank that joined last (the highest of them where several joined at once).

    Raises:
        TypeError: `optimizer` is not a wrapped optimizer.
        ValueError: in an elastic Horovod job.
        RuntimeError: the wrap has no ``uneven_inputs=True`` and this is not inside a Join.
        RankFailureError: a vote or a collective failed or timed out (COMMSCHED_TIMEOUT).
    """
    wrapped = _wrapped(optimizer)
    if not wrapped.session.vote.voting:
        raise RuntimeError("commsched.join: the wrap has no uneven_inputs=True: the other ranks "
                           "do not tell this one whether they still train. Pass "
                           "uneven_inputs=True (or set COMMSCHED_UNEVEN_INPUTS=1) on every "
                           "rank, or run the loop inside `with commsched.Join(optimizer):`")
    return _join(wrapped, model)


class Join:
    """DDP's ``Join`` context manager for a wrapped optimizer: uneven inputs within the block.

    ``with commsched.Join(optimizer): for batch in loader: ...``: inside the block every
    iteration votes first (as ``uneven_inputs=True`` does), and at the end of the block a rank
    out of batches answers the others' iterations until every rank has left it (join()). Every
    rank enters the block at the same point of its program. An exception inside the block
    leaves it without joining: the others then fail within COMMSCHED_TIMEOUT, naming this rank.

    Args:
        optimizer: the wrapped optimizer.
        model: the model, whose buffers are taken from the last joiner too (join()).
        enable: False makes the block do nothing, as DDP's ``enable=False``.

    Raises:
        TypeError: `optimizer` is not a wrapped optimizer.
        ValueError: in an elastic Horovod job.
    """

    def __init__(self, optimizer: Any, model: torch.nn.Module | None = None,
                 enable: bool = True) -> None:
        """Makes the block for `optimizer` (the class's text says how it works)."""
        self._optimizer = _wrapped(optimizer)
        self._model = model
        self._enable = enable
        self._before: NoVote | StepVote | None = None
        self.last_joined: int | None = None  # join()'s result, once the block has ended

    def __enter__(self) -> Join:
        """Turns the vote on for the block, where the wrap does not vote already."""
        session = self._optimizer.session
        if self._enable and not session.vote.voting:
            self._before = session.vote
            session.vote = StepVote(session.world)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Joins (where the block ended without an exception), then turns the vote off."""
        session = self._optimizer.session
        try:
            if kind is None and self._enable:
                self.last_joined = _join(self._optimizer, self._model)
        finally:
            if self._before is not None:
                session.vote, self._before = self._before, None
