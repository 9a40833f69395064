"""The process world: how ranks find each other (bootstrap), whether they are alive
(liveness), and whether they agree (consistency). Below the runtime: engines register here
(registry) rather than the world importing them. The user-facing calls (init, rank,
broadcast_parameters, ...) are re-exported by the package root from world.bootstrap and
world.broadcast; process sets (process_set=) are views of the world (world.process_sets)."""

from .bootstrap import init
from .consistency import check_identical, parameter_signature
from .errors import LauncherError, MismatchError, RankFailureError
from .liveness import StallWarning
from .view import World

__all__ = ["LauncherError", "MismatchError", "RankFailureError", "StallWarning", "World",
           "check_identical", "init", "parameter_signature"]
