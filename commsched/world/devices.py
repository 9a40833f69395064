"""The backend of a world commsched forms, and the GPU this process takes before an NCCL group.

Note [The device before the group]
An NCCL communicator is bound to the CUDA device that is current when the group first runs a
collective. A script that never calls ``torch.cuda.set_device`` leaves every process of a host
on cuda:0: its ranks then share one GPU (and its memory) or NCCL fails on duplicate devices.
DDP and Horovod leave the choice to the script; a new user moving a script over forgets it. So
init() chooses before it creates an NCCL group: where nothing in this process has initialised
CUDA yet, it selects ``cuda:(local_rank % device_count)``, which is also right where the launcher
gives each process one visible GPU (CUDA_VISIBLE_DEVICES, srun --gpus-per-task: a count of 1).
Where CUDA is already initialised, the script (or Lightning, Accelerate) chose: the current
device stays. ``COMMSCHED_BACKEND`` (auto, nccl, gloo) overrides the choice of backend; a group
made before init() keeps its own.
"""

from __future__ import annotations

import enum
import logging

import torch
import torch.distributed as dist

from ..config import ConfigError, load_config

log = logging.getLogger("commsched")


class Backend(enum.StrEnum):
    """The torch.distributed backend of a world's process groups."""

    NCCL = "nccl"
    GLOO = "gloo"


def choose_backend(requested: str, cuda: bool, nccl: bool) -> Backend:
    """The backend for `requested` (the knob's value), given what this process has.

    Args:
        requested: ``auto``, ``nccl`` or ``gloo`` (COMMSCHED_BACKEND's value).
        cuda: whether torch sees a CUDA device.
        nccl: whether this torch was built with NCCL.

    Returns:
        NCCL where asked for, or under ``auto`` where CUDA and NCCL are both there; else Gloo.

    Raises:
        ConfigError: NCCL asked for where CUDA or NCCL is missing.
    """
    if requested == Backend.GLOO:
        return Backend.GLOO
    if requested == Backend.NCCL:
        if not cuda or not nccl:
            missing = "no CUDA device is visible (torch.cuda.is_available() is False)" \
                if not cuda else "this torch was built without NCCL"
            raise ConfigError(f"COMMSCHED_BACKEND=nccl, but {missing}: set "
                              "COMMSCHED_BACKEND=gloo (or leave it unset) on this host")
        return Backend.NCCL
    return Backend.NCCL if cuda and nccl else Backend.GLOO


def device_for(local_rank: int, device_count: int, cuda_initialised: bool) -> int | None:
    """The CUDA device init() selects before an NCCL group (Note [The device before the group]).

    Args:
        local_rank: this process's rank on its host.
        device_count: the CUDA devices this process sees.
        cuda_initialised: whether something in this process initialised CUDA already.

    Returns:
        ``local_rank % device_count``, or None where the script chose (CUDA initialised) or no
        device is visible.
    """
    if cuda_initialised or device_count <= 0:
        return None
    return local_rank % device_count


def prepare_backend(local_rank: int) -> Backend:
    """The backend of the world being formed; under NCCL, this process's GPU selected first.

    Args:
        local_rank: this process's rank on its host, as the launcher says it.

    Returns:
        The backend to create the world's groups with.

    Raises:
        ConfigError: COMMSCHED_BACKEND has a value not allowed here (NCCL without CUDA).
    """
    cuda = torch.cuda.is_available()
    backend = choose_backend(load_config().backend, cuda, dist.is_nccl_available())
    if backend is Backend.NCCL:
        index = device_for(local_rank, torch.cuda.device_count(), torch.cuda.is_initialized())
        if index is not None:
            torch.cuda.set_device(index)
            log.debug("commsched: local rank %d selects cuda:%d", local_rank, index)
    return backend
