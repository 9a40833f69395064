"""Elastic Horovod's side of K-FAC: a state handler, so that ``hvd.elastic.TorchState(...,
kfac=preconditioner)`` commits, restores and syncs the preconditioner as it does a model or an
optimizer (Note [Elastic K-FAC] in kfac/binding.py). Horovod is imported only in an elastic
job, where it is installed."""

from __future__ import annotations

import copy
from typing import Any


def register_state_handler(preconditioner_cls: type) -> None:
    """Adds the handler of `preconditioner_cls` to Horovod's TorchState registry, once."""
    from horovod.torch.elastic import state as hvd_state

    registry = hvd_state.get_handler_registry()
    if any(cls is preconditioner_cls for cls, _ in registry):
        return
    hvd_state.set_handler_registry([*registry, (preconditioner_cls, _handler_class())])


def _handler_class() -> type:
    from horovod.torch import broadcast_object
    from horovod.torch.elastic.state import StateHandler

    class PreconditionerStateHandler(StateHandler):  # type: ignore[misc]
        """Horovod's handler protocol: save at a commit, restore after a failure, sync from
        rank 0 after the world re-formed (the state is identical on every rank)."""

        def __init__(self, preconditioner: Any) -> None:
            super().__init__(preconditioner)
            self.saved = copy.deepcopy(preconditioner.state_dict())

        def save(self) -> None:
            self.saved = copy.deepcopy(self.value.state_dict())

        def restore(self) -> None:
            self.value.load_state_dict(self.saved)

        def sync(self) -> None:
            self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))

    return PreconditionerStateHandler
