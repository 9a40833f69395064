"""Process-group bootstrap for the three ways a job is launched.

* ``horovodrun``: ``hvd.init()``; rank 0 opens a ``TCPStore`` on a free port and broadcasts its
  address with Horovod (under an explicit name: Horovod names an unnamed broadcast_object after
  the object's type, which differs between root and receivers and hangs every rank).
* ``torchrun``: ``env://`` rendezvous from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; in
  the agent's store under a prefix of the attempt when ``--max-restarts`` may restart the group.
* a lone process: world size 1, no network at all.
"""

from __future__ import annotations

import datetime
import logging
import os
import time

import torch
import torch.distributed as dist

from ..config import load_config
from . import groups, registry
from .errors import elastic, import_horovod
from .interfaces import address_towards, choose_gloo_interface
from .view import Launcher, World

log = logging.getLogger("commsched")


_world: World | None = None
_shut_down = False  # whether the last world ended in shutdown(), for world()'s message
_generation = 0  # worlds formed by this process so far (see Note [Elastic Horovod])


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


HOROVODRUN = "this process was started by horovodrun (HOROVOD_RANK is set)"


def _horovod_world(timeout: float) -> World:
    hvd = import_horovod(HOROVODRUN)

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    if size == 1:
        return World(rank, 1, local_rank, Launcher.HOROVOD, None, None, False, timeout)
    delta = datetime.timedelta(seconds=timeout)
    if dist.is_initialized():
        return _existing_world(timeout)
    store = None
    rendezvous = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    choose_gloo_interface(rendezvous, _backend())
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
    dist.init_process_group(_backend(), store=store, rank=rank, world_size=size, timeout=delta)
    w = _world_from_group(rank, size, local_rank, Launcher.HOROVOD, True, timeout)
    w.store_address = (address[0], int(address[1]))
    return w


def _world_from_group(rank: int, size: int, local_rank: int, launcher: Launcher, owns: bool,
                      timeout: float) -> World:
    group = dist.group.WORLD
    control = group if dist.get_backend(group) == "gloo" else dist.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    return World(rank, size, local_rank, launcher, group, control, owns, timeout)


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
    choose_gloo_interface(os.environ.get("MASTER_ADDR", "127.0.0.1"), _backend())
    delta = datetime.timedelta(seconds=timeout)
    namespace = _attempt_namespace()
    if namespace:
        size = int(os.environ["WORLD_SIZE"])
        store = dist.PrefixStore(namespace, dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, is_master=False,
            timeout=delta))
        dist.init_process_group(_backend(), store=store, rank=int(os.environ["RANK"]),
                                world_size=size, timeout=delta)
    else:
        dist.init_process_group(_backend(), init_method="env://", timeout=delta)
    return _world_from_group(dist.get_rank(), dist.get_world_size(),
                             int(os.environ.get("LOCAL_RANK", "0")), Launcher.TORCHRUN, True,
                             timeout)


def _existing_world(timeout: float) -> World:
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK", "0")))
    if size == 1:
        return World(rank, 1, local_rank, Launcher.EXISTING, None, None, False, timeout)
    return _world_from_group(rank, size, local_rank, Launcher.EXISTING, False, timeout)


def init(timeout: float | None = None, stall_warning: float | None = None) -> World:
    """Joins the job's world of ranks, once per process; later calls return the same world.

    How depends on the launcher. torch.distributed already initialised: its default group
    (left to you to destroy). horovodrun (HOROVOD_RANK set): ``hvd.init()``, then a TCPStore
    rendezvous whose address Horovod broadcasts. torchrun (RANK and WORLD_SIZE set): the
    ``env://`` rendezvous, in a prefix of the attempt under ``--max-restarts``. Otherwise a
    world of one, with no network at all. Collectives use NCCL where CUDA is available and Gloo
    otherwise; Gloo binds to the interface on the route to the rendezvous host unless
    GLOO_SOCKET_IFNAME is set. With more than one rank a heartbeat thread starts, which names
    the culprit when a wait fails and makes rank 0 warn about late ranks (docs/failures.md).

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
        ConfigError: a ``COMMSCHED_*`` knob read here has a value that is not allowed.
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
    elif "HOROVOD_RANK" in os.environ:
        _world = _horovod_world(seconds)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _world = _torchrun_world(seconds)
    else:
        _world = World(0, 1, 0, Launcher.LONE, None, None, False, seconds)
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
    namespace = _attempt_namespace() if w.launcher is Launcher.TORCHRUN else ""
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
    deferred update] in runtime/overlap_support.py), so the model holds the last step's
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
#   generation (its engine, groups and a plan for the new size; runtime/elastic.py).
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
