"""The process world: how ranks find each other (bootstrap), whether they are alive
(liveness), and whether they agree (consistency). Below the runtime: engines register here."""

from .bootstrap import (
    Launcher,
    World,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    is_initialized,
    local_rank,
    rank,
    shutdown,
    size,
    world,
)
from .consistency import check_identical, digest, parameter_signature
from .errors import MismatchError, RankFailureError
from .liveness import StallWarning

__all__ = [
    "Launcher", "MismatchError", "RankFailureError", "StallWarning", "World", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "check_identical", "digest", "init",
    "is_initialized", "local_rank", "parameter_signature", "rank", "shutdown", "size", "world",
]
