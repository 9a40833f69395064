"""commsched: communication scheduling for data-parallel PyTorch training, used the Horovod way.

Wrap the optimizer you have; a policy then decides how the gradients are fused and ordered
while the engine averages them across ranks. docs/api.md lists every public name.

Example:
    import commsched
    commsched.init()
    opt = commsched.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                         model=model)
"""

# Before anything loads the extension: a build for another torch is one clear error here, not
# an undefined symbol (commsched.info.check_extension).
from .info import check_extension as _check_extension

_check_extension()

from . import checkpoint
from .compression import Compression
from .config import ConfigError, Policy, load_config
from .join import Join, join
from .ops import Adasum, Average, ReduceOp, Sum
from .optimizer import DistributedOptimizer
from .world import LauncherError, MismatchError, RankFailureError, StallWarning
from .world.bootstrap import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from .world.broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .world.tensor_collectives import allgather, allreduce, allreduce_, broadcast, broadcast_

__version__ = "0.1.0"

__all__ = [
    "Adasum", "Average", "Compression", "ConfigError", "DistributedOptimizer", "Join",
    "LauncherError", "MismatchError", "Policy", "RankFailureError", "ReduceOp", "StallWarning",
    "Sum", "allgather", "allreduce", "allreduce_", "broadcast", "broadcast_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "checkpoint", "cross_rank", "cross_size",
    "init", "is_initialized", "join", "load_config", "local_rank", "local_size", "rank",
    "shutdown", "size",
]
