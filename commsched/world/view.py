"""What a process knows of its job once the world is formed: how it was launched, its rank and
size, its groups (world/bootstrap.py forms it; a process set's view is one too)."""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from . import groups
from .errors import RankFailureError, elastic, failure_type, without_backtrace


class Launcher(enum.StrEnum):
    """How this process was started, which decides how init() finds the other ranks."""

    HOROVOD = "horovod"
    TORCHRUN = "torchrun"
    MPI = "mpi"  # mpirun/mpiexec of Open MPI, MVAPICH2, MPICH or Intel MPI
    SLURM = "slurm"  # srun
    LONE = "lone"
    EXISTING = "existing"  # the user initialised torch.distributed before us


@dataclass(frozen=True)
class HostLayout:
    """Where a rank sits among the job's hosts, in Horovod's terms (local_size(), cross_rank(),
    cross_size())."""

    local_size: int = 1  # ranks on this rank's host
    cross_rank: int = 0  # this rank among the ranks of its local rank, one per host
    cross_size: int = 1  # ranks of its local rank: the hosts, where each runs as many


def host_layout(placement: list[tuple[str, int]], rank: int) -> HostLayout:
    """The HostLayout of `rank` from every rank's (host, local rank), in rank order.

    Horovod's cross communicator joins the ranks of one local rank, in rank order; under a
    launcher that gives every host as many ranks its size is the number of hosts.
    """
    host, local = placement[rank]
    peers = [r for r, (_, other) in enumerate(placement) if other == local]
    return HostLayout(sum(1 for h, _ in placement if h == host), peers.index(rank), len(peers))


@dataclass
class World:
    """One process's view of the job: its rank among `size`, how it was launched, its groups.

    commsched's own modules pass it around; users read the same facts through rank(), size()
    and local_rank(). A process set's view (world.process_sets) is a World too.
    """

    rank: int
    size: int
    local_rank: int
    launcher: Launcher
    process_group: Any | None  # the data-plane group; None for a world of one
    control_group: Any | None  # Gloo group for small control messages (plans, hashes)
    owns_process_group: bool
    timeout: float
    store_address: tuple[str, int] | None = None  # rendezvous store, for heartbeats
    store_prefix: str = ""  # the job's keys in that store (world/bootstrap.py)
    liveness: Any = None
    generation: int = 0  # how many worlds this process formed before (elastic re-forming)
    layout: HostLayout = field(default_factory=HostLayout)  # its place among the job's hosts
    broken: bool = False  # a collective failed: an elastic job re-forms the world
    # A process set's view of the world (world.process_sets): the global ranks of its members,
    # `rank` and `size` being within the set; None for the whole world.
    members: tuple[int, ...] | None = None
    subsets: dict[tuple[int, ...], World] = field(default_factory=dict)  # views made so far
    # The whole world, for a process set's view (whose groups were made in it).
    parent: World | None = field(default=None, repr=False, compare=False)

    def global_rank(self, rank: int) -> int:
        """The global rank of this world's `rank` (itself for the whole world)."""
        return rank if self.members is None else self.members[rank]

    def fail(self, text: str) -> RankFailureError:
        """The error for a failed collective of this world; marks the world broken.

        An elastic job re-forms a broken world at the next step (Note [Elastic Horovod]).
        """
        self.broken = True
        if self.parent is not None:  # re-form the world its groups were made in
            self.parent.broken = True
        return failure_type()(text)

    def run(self, what: str, call: Any, *args: Any, group: Any, **kwargs: Any) -> None:
        """One torch.distributed `call` on `group` of this world; in an elastic job a failure
        is Horovod's error (failure_type), naming `what` failed, and marks the world broken."""
        try:
            call(*args, group=group, **kwargs)
        except RuntimeError as err:
            if not elastic():
                raise
            raise self.fail(f"commsched: {what} failed: {without_backtrace(err)}"
                            ) from None  # its text holds err's, without the C++ frames

    def _control(self, call: Any, *args: Any, **kwargs: Any) -> None:
        self.run("a control message", call, *args, group=self.control_group, **kwargs)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, over the control group (all ranks call it)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        self._control(dist.all_gather_object, out, obj)
        return out

    def new_data_group(self) -> Any | None:
        """A process group of its own for one engine (all ranks call this together, at wrap time).

        Its collectives can then never interleave with another engine's, DDP's or the user's
        own, which would pair different collectives across ranks once updates overlap the next
        iteration.
        """
        if self.size == 1:
            return None
        backend = dist.get_backend(self.process_group)
        if self.members is not None:
            return groups.subgroup(self.members, backend, self.timeout)
        return groups.track(dist.new_group(ranks=list(range(self.size)), backend=backend,
                                           timeout=datetime.timedelta(seconds=self.timeout)))

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """`obj` as rank `root` of this world has it (all ranks call it), over the control group."""
        if self.size == 1:
            return obj
        box = [obj if self.rank == root else None]
        self._control(dist.broadcast_object_list, box, src=self.global_rank(root))
        return box[0]
