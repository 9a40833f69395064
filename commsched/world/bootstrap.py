"""Process-group bootstrap for every way a job is launched.

Note [Which launcher started this process] in world/launchers.py says how the launcher is read.

* ``horovodrun`` (Gloo controller): ``hvd.init()``; rank 0 opens a ``TCPStore`` on a free port
  and broadcasts its address with Horovod (under an explicit name: Horovod names an unnamed
  broadcast_object after the object's type, which differs between root and receivers and hangs
  every rank).
* ``torchrun``: ``env://`` rendezvous from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; in
  the agent's store under a prefix of the attempt when ``--max-restarts`` may restart the group.
* ``mpirun``/``mpiexec`` (Open MPI, horovodrun's MPI controller, MVAPICH2, MPICH, Intel MPI) and
  ``srun``: rank and size from the launcher, the rendezvous as Note [Finding the rendezvous]
  says.
* a lone process: world size 1, no network at all.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
import tempfile
import time

import torch.distributed as dist

from ..config import load_config
from . import groups, registry
from .devices import prepare_backend
from .errors import LauncherError, elastic, import_horovod
from .launchers import LaunchedAs, derived_port, read_launcher
from .network_interfaces import address_towards, choose_gloo_interface
from .view import HostLayout, Launcher, World, host_layout

log = logging.getLogger("commsched")


_world: World | None = None
_shut_down = False  # whether the last world ended in shutdown(), for world()'s message
_generation = 0  # worlds formed by this process so far (see Note [Elastic Horovod])


HOROVODRUN = "this process was started by horovodrun (HOROVOD_RANK is set)"


def _horovod_world(timeout: float, launched: LaunchedAs | None = None) -> World:
    """The world through Horovod.

    Started by horovodrun (`launched` None), or by an MPI launcher whose ranks Horovod (built
    with MPI) connects (Note [Finding the rendezvous]).
    """
    hvd = import_horovod(HOROVODRUN if launched is None else
                         f"this {launched.name} job ({launched.describe()}) forms its world "
                         "through Horovod")

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    if launched is not None and (rank, size) != (launched.rank, launched.size):
        raise LauncherError(f"commsched: Horovod says rank {rank} of {size}, but the launcher "
                            f"says rank {launched.rank} of {launched.size} "
                            f"({launched.describe()}): was hvd.init() given a process set or "
                            "another communicator?")
    if size == 1:
        return World(rank, 1, local_rank, Launcher.HOROVOD, None, None, False, timeout)
    delta = datetime.timedelta(seconds=timeout)
    if dist.is_initialized():
        return _existing_world(timeout)
    store = None
    rendezvous = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or (
        "127.0.0.1" if launched is None or launched.single_host else _route_probe())
    backend = prepare_backend(local_rank)  # Note [The device before the group]
    choose_gloo_interface(rendezvous)
    if rank == 0:
        port = int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "1"))
        host = address_towards(rendezvous, port)
        store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=delta)
        address = (host, store.port)
    else:
        address = None
    address = hvd.broadcast_object(address, root_rank=0, name="commsched.bootstrap.store")
    if rank != 0:
        store = dist.TCPStore(address[0], address[1], size, is_master=False, timeout=delta)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=delta)
    w = _world_from_group(rank, size, local_rank, Launcher.HOROVOD, True, timeout,
                          HostLayout(hvd.local_size(), hvd.cross_rank(), hvd.cross_size()))
    w.store_address = (address[0], int(address[1]))
    return w


def _route_probe() -> str:
    """A host whose route leaves this one towards the job's other hosts.

    Open MPI's mpirun host (from its URI), else this host's own name resolved.
    """
    uri = os.environ.get("OMPI_MCA_orte_hnp_uri", "")  # noqa: SIM112 (Open MPI's spelling)
    for part in uri.split(";")[1:]:
        if part.startswith("tcp://"):
            return part[len("tcp://"):].split(",")[0].rsplit(":", 1)[0]
    return socket.gethostbyname(socket.getfqdn())


# Note [Finding the rendezvous]
# An MPI launcher or srun says each process's rank and the job's size, but c10d needs one
# address that every rank reaches, where rank 0 serves a TCPStore. The first of these wins
# (docs/usage.md, "Launchers", says it to users):
# 1. MASTER_ADDR (and MASTER_PORT, else a port derived from the job) set by the user or the
#    job script, as torchrun and DeepSpeed read them;
# 2. Horovod, where the script loaded it (``import horovod.torch``): hvd.init() connects the
#    ranks, and rank 0 broadcasts its store's address through it, as under horovodrun;
# 3. every rank on this host (the launcher's local size is the size, or srun's step has one
#    node): rank 0 serves the store on a free loopback port and leaves the port in a file
#    named after the job (its id, else the ranks' common parent process) in the temporary
#    directory, which the others read; the file goes once the group is formed;
# 4. srun over several nodes: the first node of the step's node list, at a port derived from
#    the job and step ids (as Lightning's SLURMEnvironment does);
# 5. an MPI job over several hosts, with Horovod installed with MPI: as 2;
# 6. otherwise LauncherError, naming the variables read and what to set.
# A derived port may be taken: rank 0 then fails to serve it (and says to set MASTER_PORT),
# and its keys sit under the job's prefix, so no rank ever joins another job's world.


def _launched_world(launched: LaunchedAs, timeout: float) -> World:
    """The world of an MPI launcher's or srun's job (Note [Finding the rendezvous])."""
    if launched.size == 1:
        return World(0, 1, launched.local_rank, launched.launcher, None, None, False, timeout)
    prefix = f"commsched/{launched.job or _parent_key()}/"
    master = os.environ.get("MASTER_ADDR")
    if master:
        port = os.environ.get("MASTER_PORT")
        return _store_world(launched, master, int(port) if port else derived_port(prefix),
                            prefix, timeout)
    if "horovod.torch" in sys.modules:
        return _horovod_world(timeout, launched)
    if launched.single_host:
        return _local_world(launched, prefix, timeout)
    if launched.first_host is not None:
        return _store_world(launched, launched.first_host, derived_port(prefix), prefix, timeout)
    if launched.launcher is Launcher.MPI and _horovod_has_mpi():
        return _horovod_world(timeout, launched)
    where = "its ranks span several hosts" if launched.single_host is False else \
        "it does not say whether its ranks share one host"
    raise LauncherError(
        f"commsched: this process is rank {launched.rank} of {launched.size} of a "
        f"{launched.name} job ({launched.describe()}), but {where} and no rendezvous address "
        "is known: set MASTER_ADDR (a host of rank 0) and MASTER_PORT on every rank (mpirun "
        "-x MASTER_ADDR=... -x MASTER_PORT=...), or import horovod.torch before commsched "
        "forms its world (Horovod built with MPI); docs/usage.md, \"Launchers\"")


def _horovod_has_mpi() -> bool:
    try:
        import horovod.torch as hvd
    except ImportError:
        return False
    return bool(hvd.mpi_built())


def _parent_key() -> str:
    """A key of this host's ranks where the launcher names no job (MPICH's Hydra).

    Their common parent process, the launcher's proxy, with its start time against a reused pid.
    """
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat", encoding="utf-8") as handle:
            started = handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return f"ppid-{parent}-{started}"


def _store_world(launched: LaunchedAs, host: str, port: int, prefix: str,
                 timeout: float) -> World:
    """Rank 0 serves a TCPStore at `host`:`port`, the others connect; keys under `prefix`."""
    delta = datetime.timedelta(seconds=timeout)
    choose_gloo_interface(host)
    try:
        store = dist.TCPStore(host, port, launched.size, is_master=launched.rank == 0,
                              wait_for_workers=False, timeout=delta)
    except (RuntimeError, OSError) as err:
        role = "serve the rendezvous store at" if launched.rank == 0 else "reach rank 0's " \
            "rendezvous store at"
        raise LauncherError(f"commsched: rank {launched.rank} of a {launched.name} job could "
                            f"not {role} {host}:{port} ({err}); set MASTER_ADDR and MASTER_PORT "
                            f"to a host of rank 0 and a free port ({launched.describe()})"
                            ) from err
    return _group_world(launched, dist.PrefixStore(prefix, store), (host, port), prefix,
                        timeout)


def _local_world(launched: LaunchedAs, prefix: str, timeout: float) -> World:
    """Every rank on this host: rank 0's store on a free port, told through a file.

    Note [Finding the rendezvous], case 3.
    """
    delta = datetime.timedelta(seconds=timeout)
    name = "".join(c if c.isalnum() or c in "-." else "_" for c in prefix.strip("/"))
    path = os.path.join(tempfile.gettempdir(), f"{name}-{launched.size}.port")
    if launched.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, launched.size, is_master=True,
                              wait_for_workers=False, timeout=delta)
        with open(path + ".part", "w", encoding="utf-8") as handle:
            handle.write(str(store.port))
        os.replace(path + ".part", path)
        port = store.port
    else:
        port = _read_port(path, launched, timeout)
        store = dist.TCPStore("127.0.0.1", port, launched.size, is_master=False, timeout=delta)
    try:
        return _group_world(launched, dist.PrefixStore(prefix, store), ("127.0.0.1", port),
                            prefix, timeout)
    finally:
        if launched.rank == 0 and os.path.exists(path):
            os.remove(path)  # every rank has joined (or the group failed)


def _read_port(path: str, launched: LaunchedAs, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, encoding="utf-8") as handle:
                return int(handle.read())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"commsched: rank {launched.rank} of a {launched.name} job on one host "
                    f"({launched.describe()}) waited {timeout:.0f} s (COMMSCHED_TIMEOUT) for "
                    f"rank 0's rendezvous file {path}: is rank 0 running, on this host, with "
                    "the same temporary directory? Set MASTER_ADDR and MASTER_PORT otherwise"
                    ) from None
            time.sleep(0.02)


def _group_world(launched: LaunchedAs, store: dist.Store, address: tuple[str, int], prefix: str,
                 timeout: float) -> World:
    backend = prepare_backend(launched.local_rank)  # Note [The device before the group]
    dist.init_process_group(backend, store=store, rank=launched.rank, world_size=launched.size,
                            timeout=datetime.timedelta(seconds=timeout))
    w = _world_from_group(launched.rank, launched.size, launched.local_rank, launched.launcher,
                          True, timeout, node=launched.node)
    w.store_address, w.store_prefix = address, prefix
    return w


def _world_from_group(rank: int, size: int, local_rank: int, launcher: Launcher, owns: bool,
                      timeout: float, layout: HostLayout | None = None, node: str = "") -> World:
    """The world of the default group, with its layout among the job's hosts.

    `layout` where the launcher knows it; else the ranks tell each other their host (`node`,
    the launcher's name for it, else the host name).
    """
    group = dist.group.WORLD
    control = group if dist.get_backend(group) == "gloo" else dist.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    w = World(rank, size, local_rank, launcher, group, control, owns, timeout)
    w.layout = layout or host_layout(w.all_gather_object((node or socket.gethostname(),
                                                          local_rank)), rank)
    return w


def _attempt_namespace() -> str:
    """The store's key prefix for this attempt of a torchrun job ("" outside torchrun's agent).

    The agent hosts one store for all restarts of the group (TORCHELASTIC_USE_AGENT_STORE) and
    keeps every key in it: a restarted rank would read the previous attempt's Gloo addresses and
    dial ranks that are gone ("Connection refused"), or take stale heartbeats for its peers.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return ""
    return f"commsched/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def _torchrun_world(timeout: float) -> World:
    # See Note [The device before the group] (world/devices.py).
    backend = prepare_backend(int(os.environ.get("LOCAL_RANK", "0")))
    choose_gloo_interface(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    delta = datetime.timedelta(seconds=timeout)
    namespace = _attempt_namespace()
    if namespace:
        size = int(os.environ["WORLD_SIZE"])
        store = dist.PrefixStore(namespace, dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, is_master=False,
            timeout=delta))
        dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                world_size=size, timeout=delta)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=delta)
    return _world_from_group(dist.get_rank(), dist.get_world_size(),
                             int(os.environ.get("LOCAL_RANK", "0")), Launcher.TORCHRUN, True,
                             timeout, node=read_launcher(os.environ).node)


def _existing_world(timeout: float) -> World:
    rank, size = dist.get_rank(), dist.get_world_size()
    try:  # the launcher's word for it; a group made by hand may come with no launcher at all
        launched = read_launcher(os.environ)
        local_rank, node = launched.local_rank, launched.node
    except LauncherError:
        local_rank, node = 0, ""
    if size == 1:
        return World(rank, 1, local_rank, Launcher.EXISTING, None, None, False, timeout)
    return _world_from_group(rank, size, local_rank, Launcher.EXISTING, False, timeout,
                             node=node)


def init(timeout: float | None = None, stall_warning: float | None = None) -> World:
    """Joins the job's world of ranks, once per process; later calls return the same world.

    How depends on the launcher (docs/usage.md, "Launchers"). torch.distributed already
    initialised (by you, Lightning or Accelerate): its default group (left to you to destroy).
    horovodrun with Gloo (HOROVOD_RANK set): ``hvd.init()``, then a TCPStore rendezvous whose
    address Horovod broadcasts. torchrun (RANK and WORLD_SIZE set): the ``env://`` rendezvous,
    in a prefix of the attempt under ``--max-restarts``. mpirun/mpiexec (Open MPI, so also
    horovodrun with MPI; MVAPICH2; MPICH; Intel MPI) and srun: rank and size from the
    launcher's variables; the rendezvous at MASTER_ADDR/MASTER_PORT where set, else through
    Horovod where it is loaded, else on this host when every rank is here, else at the first
    node of srun's node list (Note [Finding the rendezvous]). No launcher: a world of one, with
    no network at all, but never where a launcher's variables say more than one process.
    Collectives use NCCL where CUDA is available and Gloo otherwise, unless COMMSCHED_BACKEND
    says which; before an NCCL group it selects ``cuda:local_rank()`` unless this process has
    initialised CUDA already (Note [The device before the group] in world/devices.py). Gloo
    binds to the interface on the route to the rendezvous host unless GLOO_SOCKET_IFNAME is set
    (the control messages go over Gloo under NCCL too). With more than one rank
    a heartbeat thread starts, which names the culprit when a wait fails and makes rank 0 warn
    about late ranks (docs/failures.md).

    Calling it is optional: a wrap or a broadcast calls it when nothing did, so a Horovod
    script that calls ``hvd.init()`` works unchanged.

    Args:
        timeout: seconds that the rendezvous and every later wait may take; None:
            COMMSCHED_TIMEOUT (300 unless set). Ignored once the world exists.
        stall_warning: seconds a rank may wait before rank 0 warns (StallWarning), from now
            on, also when the world exists already (a wrapped optimizer passes its resolved
            knob, whose default follows its own timeout); None: unchanged, or for a new world
            COMMSCHED_STALL_WARNING (a fifth of the timeout unless set).

    Returns:
        The world (commsched's internal record of this process's rank, size, local rank,
        launcher and process groups).

    Raises:
        HorovodMissingError: started by horovodrun, but ``horovod.torch`` cannot be imported
            (commsched.world.errors; the message says how to install it).
        LauncherError: a launcher's variables say more than one process, but they are
            incomplete or out of range, this is a Slurm allocation's shell rather than an srun
            task, or no rendezvous can be found; the message names the variables and what to
            set.
        ConfigError: a ``COMMSCHED_*`` knob read here has a value that is not allowed
            (COMMSCHED_BACKEND=nccl where no CUDA device is visible, say).
        RuntimeError: torch.distributed's rendezvous failed or timed out (its own errors, as
            ``init_process_group`` raises them).
        ValueError: torch.distributed found a rendezvous variable missing (MASTER_ADDR, say).
    """
    global _world
    if _world is not None:
        if stall_warning is not None and _world.liveness is not None:
            _world.liveness.stall_warning = stall_warning
        return _world
    seconds = timeout if timeout is not None else load_config().timeout
    if dist.is_available() and dist.is_initialized():
        _world = _existing_world(seconds)
    else:
        launched = read_launcher(os.environ)
        if launched.launcher is Launcher.HOROVOD:
            _world = _horovod_world(seconds)
        elif launched.launcher is Launcher.TORCHRUN:
            _world = _torchrun_world(seconds)
        elif launched.launcher is Launcher.LONE:
            _world = World(0, 1, 0, Launcher.LONE, None, None, False, seconds)
        else:
            _world = _launched_world(launched, seconds)
    _world.generation = _generation
    _start_liveness(_world, stall_warning)
    log.debug("commsched.init: rank %d of %d via %s", _world.rank, _world.size,
              _world.launcher.value)
    return _world


def _start_liveness(w: World, stall_warning: float | None) -> None:
    address = w.store_address
    if address is None and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if w.size == 1 or address is None:
        return
    from .liveness import Liveness

    if stall_warning is None:  # unset, it follows the world's timeout
        stall_warning = load_config({"timeout": w.timeout}).stall_warning
    namespace = _attempt_namespace() if w.launcher is Launcher.TORCHRUN else w.store_prefix
    w.liveness = Liveness(address[0], address[1], w.rank, w.size, stall_warning,
                          registry.participants, namespace)


def world() -> World:
    """The world init() made, for commsched's own modules.

    Raises:
        RuntimeError: commsched is not initialised, or was shut down; the message says to call
            commsched.init().
    """
    if _world is None:
        if _shut_down:
            raise RuntimeError("commsched was shut down (commsched.shutdown()): call "
                               "commsched.init() to start it again")
        raise RuntimeError("commsched is not initialised: call commsched.init() first")
    return _world


def is_initialized() -> bool:
    """Tells whether commsched has a world now, without making one.

    Returns:
        True after init() (or a wrap or a broadcast that called it) until shutdown(); False
        before it and after shutdown().
    """
    return _world is not None


def shutdown() -> None:
    """Ends commsched in this process: applies deferred updates, stops engines, drops groups.

    Applies the updates that overlap plans still defer to the next forward pass (Note [The last
    deferred update] in runtime/modes/overlap/runner.py), so the model holds the last step's
    parameters; stops every engine and its threads; destroys the process groups commsched
    created (one you initialised before commsched stays yours); under horovodrun, shuts Horovod
    down. Call it on every rank at the end of training: a rank that ends without it while others
    still wait for it is reported to them as crashed or returned early. Calling it twice is
    harmless, and init() may start commsched again afterwards.

    Warns:
        RuntimeWarning: a deferred update could not be applied (a peer gone, the world broken);
            the warning says why, and shutdown goes on.
    """
    global _world, _shut_down
    registry.apply_deferred()
    registry.shutdown_all()
    groups.forget()
    if _world is None:
        return
    if _world.liveness is not None:
        _world.liveness.stop()
    if _world.owns_process_group and dist.is_initialized():
        # Destroying the groups joins Gloo's worker threads while this thread holds the GIL; a
        # worker still freeing a tensor of the last collective may need the GIL for that. Let
        # go of it briefly first (the engines' own groups are released without it).
        time.sleep(0.05)
        dist.destroy_process_group()
    if _world.launcher is Launcher.HOROVOD:
        import_horovod(HOROVODRUN).shutdown()
    _world = None
    _shut_down = True


# Note [Elastic Horovod]
# Under ``hvd.elastic.run`` the set of workers changes: a worker dies (its peers' collectives
# fail) or the host-discovery script adds or removes hosts (HostsUpdatedInterrupt at a commit).
# Horovod then restores the last commit (after a failure), re-initialises itself with the new
# ranks (hvd.shutdown(); hvd.init()) and re-runs the training function after state.sync().
# commsched follows without any call from the user:
# * a failed collective raises failure_type(), which is also Horovod's HorovodInternalError,
#   and marks the world broken;
# * at the next step every session asks `stale()`: broken, or Horovod's rank or size is no
#   longer the world's. The first to see it calls `reform()` (stop every engine, drop the
#   groups, form a new world from Horovod's new ranks); each session then rebinds to the new
#   generation (its engine, groups and a plan for the new size; runtime/elastic_guard.py).
# Every rank reaches that step together: Horovod re-runs the training function on all of them
# after the sync, and a joining worker forms its first world there too (a session in an
# elastic job binds lazily: its wrap happens while the others are still in their reset).
# Horovod's sync steps a joining worker's optimizer once on zero gradients when it has no state
# yet (broadcast_optimizer_state), on that worker alone: a step() with no gradient handed over
# while the world is stale is taken for that and stays local (ElasticGuard.state_step), so a
# rank with no gradient at all in the first iteration after a reset would not join the others.
# What cannot be seen: the workers replaced by as many others at a HostsUpdatedInterrupt, with
# no failure and each rank keeping its number: the new workers then wait for the old ones in
# the new world's rendezvous until COMMSCHED_TIMEOUT.


def stale() -> bool:
    """Whether the world must be (re-)formed before the next collective.

    It must when there is none yet, a collective failed, or Horovod re-initialised with other
    ranks (Note [Elastic Horovod]).
    """
    w = _world
    if w is None or w.broken:
        return True
    if w.launcher is Launcher.HOROVOD and elastic():
        hvd = import_horovod(HOROVODRUN)
        return (hvd.rank(), hvd.size()) != (w.rank, w.size)
    return False


def outdated(formed: World) -> bool:
    """Tells whether what was made for the world `formed` must be made again.

    Args:
        formed: the world the parts were made for.

    Returns:
        True when the world must be (re-)formed (stale()), or was since `formed`.
    """
    return stale() or _world is not formed


def current(timeout: float, stall_warning: float | None) -> World:
    """The world of now: the existing one, or in an elastic job a re-formed one when it is stale.

    All ranks call this together at a step (Note [Elastic Horovod]).
    """
    if _world is not None and elastic() and stale():
        return reform()
    return init(timeout, stall_warning)


def reform() -> World:
    """Stops every engine, drops the process groups and forms the world anew from Horovod's ranks.

    It keeps the timeout and stall warning; Horovod itself stays initialised.
    """
    global _world, _generation
    old = _world
    assert old is not None
    registry.shutdown_all()
    stall_warning = old.liveness.stall_warning if old.liveness is not None else None
    if old.liveness is not None:
        old.liveness.stop()
    if old.owns_process_group and dist.is_initialized():
        time.sleep(0.05)  # as in shutdown(): let Gloo's workers take the GIL once more
        dist.destroy_process_group()
    groups.forget()  # a joining worker names its process sets' groups from zero
    _world = None
    _generation += 1
    log.info("commsched: re-forming the world (was rank %d of %d)", old.rank, old.size)
    return init(old.timeout, stall_warning)


def rank() -> int:
    """This process's rank, as ``hvd.rank()``: use it to let one rank log or save checkpoints.

    Returns:
        The rank in the whole world, 0 to size() - 1 (also for a member of a process set).

    Raises:
        RuntimeError: before init() (or a wrap or a broadcast) made the world, or after
            shutdown().
    """
    return world().rank


def size() -> int:
    """The number of ranks in the world, as ``hvd.size()``; 1 for a lone process.

    Returns:
        The number of processes in the job.

    Raises:
        RuntimeError: before init() made the world, or after shutdown().
    """
    return world().size


def local_rank() -> int:
    """This process's rank on its host, as ``hvd.local_rank()``: the GPU it should use.

    It comes from Horovod under horovodrun, LOCAL_RANK under torchrun, and is 0 for a lone
    process. Typical use: ``torch.cuda.set_device(commsched.local_rank())``.

    Returns:
        The local rank, 0 to the number of ranks on this host - 1.

    Raises:
        RuntimeError: before init() made the world, or after shutdown().
    """
    return world().local_rank


def local_size() -> int:
    """The number of ranks on this host, as ``hvd.local_size()``; 1 for a lone process.

    Returns:
        The ranks that share this process's host (Horovod's word under horovodrun; otherwise
        the ranks that the launcher places on this host, or that share its host name).

    Raises:
        RuntimeError: before init() made the world, or after shutdown().
    """
    return world().layout.local_size


def cross_rank() -> int:
    """This process's rank among the ranks of its local rank, as ``hvd.cross_rank()``.

    With as many ranks on every host, it is the number of this process's host: 0 on the first
    host, 1 on the second, and so on (use it to let one host download a dataset).

    Returns:
        The rank within the cross group, 0 to cross_size() - 1.

    Raises:
        RuntimeError: before init() made the world, or after shutdown().
    """
    return world().layout.cross_rank


def cross_size() -> int:
    """The number of ranks of this process's local rank, as ``hvd.cross_size()``.

    With as many ranks on every host, it is the number of hosts of the job.

    Returns:
        The size of the cross group; 1 for a job on one host.

    Raises:
        RuntimeError: before init() made the world, or after shutdown().
    """
    return world().layout.cross_size
