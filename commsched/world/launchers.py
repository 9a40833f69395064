"""What the launcher's variables say about this process: its rank, the job's size, its rank on
its host, and where a rendezvous can be found. Pure: it reads a mapping of variables and makes
nothing (world/bootstrap.py forms the world from it).

Note [Which launcher started this process]
The variables are read in this order; the first launcher that set its own wins:
* horovodrun's Gloo controller: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK.
* torchrun, or any launcher of torch's ``env://`` (Accelerate's, DeepSpeed's, Lightning's
  own): RANK and WORLD_SIZE (LOCAL_RANK, LOCAL_WORLD_SIZE).
* Open MPI's mpirun/mpiexec, which horovodrun's MPI controller runs too: OMPI_COMM_WORLD_RANK,
  _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
* MVAPICH2: MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
* MPICH's and Intel MPI's Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.
* Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_NUM_NODES,
  SLURM_STEP_NODELIST. Only srun's tasks have a step: a batch script or an salloc shell has
  SLURM_NTASKS but is one process, so more than one task there without a step is an error
  (launch with srun), not a world of one.
A launcher inside another (torchrun or mpirun in an sbatch script, srun --mpi=pmix) sets its
own variables beside the outer one's, and it is the inner one that started this process: hence
the order. Where no launcher says more than one process, the process is a world of one; where
one does but its variables are incomplete or out of range, LauncherError names them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import LauncherError
from .view import Launcher


@dataclass(frozen=True)
class MPIFlavour:
    """One MPI implementation's names for rank, size, local rank and local size."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


MPI_FLAVOURS = (
    MPIFlavour("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    MPIFlavour("MVAPICH2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
               "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    MPIFlavour("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


@dataclass(frozen=True)
class LaunchedAs:
    """This process as its launcher describes it.

    `seen` holds the variables that were read, for messages; `job` is a key equal on every
    rank of the job and on no other job's (for a rendezvous of its own); `single_host` tells
    whether every rank runs on this host; `first_host` is the host of rank 0 where the launcher
    says it (Slurm's first node of the step); `node` names this process's host where the
    launcher numbers its hosts (torchrun's GROUP_RANK, Slurm's SLURM_NODEID), "" elsewhere.
    """

    launcher: Launcher
    rank: int
    size: int
    local_rank: int
    name: str = ""  # the launcher, as a user knows it
    seen: dict[str, str] = field(default_factory=dict)
    job: str = ""
    single_host: bool | None = None
    first_host: str | None = None
    node: str = ""

    def describe(self) -> str:
        """'VAR=value, ...' of what was read, for a message."""
        return ", ".join(f"{k}={v}" for k, v in self.seen.items())


def _int(env: Mapping[str, str], name: str, seen: dict[str, str], default: int | None = None,
         low: int = 0) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise LauncherError(f"commsched: {name} is not set, but the launcher's other "
                                f"variables are ({_listed(seen)}); set {name} as well, or "
                                "unset them for a world of one")
        return default
    seen[name] = raw
    try:
        value = int(raw.strip())
    except ValueError:
        raise LauncherError(f"commsched: {name}={raw!r} is not an integer ({_listed(seen)})"
                            ) from None
    if value < low:
        raise LauncherError(f"commsched: {name}={value} must be at least {low} "
                            f"({_listed(seen)})")
    return value


def _listed(seen: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in seen.items()) or "none"


def _checked(launched: LaunchedAs) -> LaunchedAs:
    if launched.rank >= launched.size:
        raise LauncherError(f"commsched: rank {launched.rank} is outside a world of "
                            f"{launched.size} ({launched.describe()})")
    return launched


def read_launcher(env: Mapping[str, str]) -> LaunchedAs:
    """Reads which launcher started this process and what it says (Note [Which launcher
    started this process]).

    Args:
        env: the process's environment variables (``os.environ``).

    Returns:
        The launcher, rank, size and local rank; Launcher.LONE with size 1 where none says
        more than one process.

    Raises:
        LauncherError: a launcher's variables say more than one process but are incomplete,
            not integers, or out of range, or this is a Slurm allocation's shell rather than
            one of srun's tasks; the message names the variables.
    """
    if "HOROVOD_RANK" in env:
        seen: dict[str, str] = {}
        rank = _int(env, "HOROVOD_RANK", seen)
        size = _int(env, "HOROVOD_SIZE", seen, low=1)
        return _checked(LaunchedAs(Launcher.HOROVOD, rank, size,
                                   _int(env, "HOROVOD_LOCAL_RANK", seen, 0), "horovodrun", seen))
    if "RANK" in env or "WORLD_SIZE" in env:
        seen = {}
        size = _int(env, "WORLD_SIZE", seen, None if "RANK" in env else 1, low=1)
        if "RANK" in env or size > 1:
            rank = _int(env, "RANK", seen)
            node = f"torchrun-node-{env['GROUP_RANK']}" if "GROUP_RANK" in env else ""
            return _checked(LaunchedAs(Launcher.TORCHRUN, rank, size,
                                       _int(env, "LOCAL_RANK", seen, 0), "torchrun", seen,
                                       node=node))
    for flavour in MPI_FLAVOURS:
        if flavour.rank in env or flavour.size in env:
            seen = {}
            size = _int(env, flavour.size, seen, low=1)
            rank = _int(env, flavour.rank, seen)
            local_rank = _int(env, flavour.local_rank, seen, 0)
            local_size = _int(env, flavour.local_size, seen, 0)  # 0: not said
            return _checked(LaunchedAs(Launcher.MPI, rank, size, local_rank, flavour.name,
                                       seen, _mpi_job(env),
                                       local_size == size if local_size else None))
    if "SLURM_STEP_NUM_TASKS" in env:
        seen = {}
        size = _int(env, "SLURM_STEP_NUM_TASKS", seen, low=1)
        rank = _int(env, "SLURM_PROCID", seen)
        local_rank = _int(env, "SLURM_LOCALID", seen, 0)
        nodes = _int(env, "SLURM_STEP_NUM_NODES", seen, 0)  # 0: not said
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if nodelist:
            seen["SLURM_STEP_NODELIST"] = nodelist
        job = f"slurm-{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"
        node = f"slurm-node-{env['SLURM_NODEID']}" if "SLURM_NODEID" in env else ""
        return _checked(LaunchedAs(Launcher.SLURM, rank, size, local_rank, "srun", seen, job,
                                   nodes == 1 if nodes else None,
                                   first_host(nodelist) if nodelist else None, node))
    tasks = env.get("SLURM_NTASKS")
    if tasks is not None and tasks.strip().isdigit() and int(tasks) > 1:
        raise LauncherError(
            f"commsched: SLURM_NTASKS={tasks} says this Slurm job has {tasks} tasks, but this "
            "process is no task of an srun step (SLURM_STEP_NUM_TASKS is unset: a batch script "
            "or an salloc shell): start the training script with `srun python ...` (or "
            "torchrun, mpirun), so that each task runs it; it would otherwise train alone")
    return LaunchedAs(Launcher.LONE, 0, 1, 0, "none")


def _mpi_job(env: Mapping[str, str]) -> str:
    """A key of the MPI job, equal on its ranks: Open MPI's job id, PMIx's namespace, or, for
    Hydra, which exports none, the id of the process manager's proxy on this host (the ranks'
    parent; bootstrap adds it)."""
    for name in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "MV2_COMM_WORLD_JOBID"):
        if env.get(name):
            return f"mpi-{env[name]}"
    return ""


_RANGE = re.compile(r"^(?P<prefix>[^\[\],]*)\[(?P<ranges>[^\]]+)\](?P<suffix>[^,]*)")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[07-09,12],gpu1`` -> ``node07``.

    Args:
        nodelist: SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, in Slurm's compressed form.

    Returns:
        Its first host name, zero padding kept.

    Raises:
        LauncherError: the list is empty or its first entry cannot be read.
    """
    text = nodelist.strip()
    match = _RANGE.match(text)
    if match is None:
        host = text.split(",", 1)[0].strip()
        if not host or "[" in host or "]" in host:
            raise LauncherError(f"commsched: cannot read the first host of Slurm's node list "
                                f"{nodelist!r}; set MASTER_ADDR to it")
        return host
    first = re.split(r"[,-]", match["ranges"], maxsplit=1)[0].strip()
    if not first.isdigit():
        raise LauncherError(f"commsched: cannot read the first host of Slurm's node list "
                            f"{nodelist!r}; set MASTER_ADDR to it")
    return f"{match['prefix']}{first}{match['suffix'].split('[', 1)[0]}"


def derived_port(job: str) -> int:
    """A port in 20000-39999 equal on every rank of `job`, for a rendezvous across hosts that
    no variable names (Slurm's first node, as Lightning's SLURMEnvironment does)."""
    value = 0
    for char in job:
        value = (value * 131 + ord(char)) % 1_000_003
    return 20000 + value % 20000
