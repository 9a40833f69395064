"""Horovod's collectives on your own tensors: allreduce, allgather, broadcast.

For metrics, loss averages or a seed, in every launcher's job. They run on the world's own
groups, which no engine uses (each engine has a group of its own), so they never pair with a
gradient collective in flight. A CUDA tensor goes over the world's data group (NCCL under
NCCL); a CPU tensor goes over its Gloo control group, so that a metric kept on the CPU can be
averaged in an NCCL job too. Like Horovod's, they need nothing but a launcher: the first call
initialises commsched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..ops import ReduceOp, resolve_op
from .bootstrap import init
from .process_sets import members_of, root_within, world_for
from .view import World


def _world_of(process_set: Any, call: str) -> World:
    whole = init()
    members = members_of(process_set, whole.size)
    if members is not None and whole.rank not in members:
        raise ValueError(f"commsched.{call}: rank {whole.rank} is not in the process set "
                         f"{list(members)}: only its members call it")
    return world_for(whole, process_set)


def _group(world: World, tensor: torch.Tensor) -> Any:
    return world.process_group if tensor.is_cuda else world.control_group


def _reduce_op(average: bool | None, op: Any) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("commsched.allreduce: give op= or the older average=, not both")
    if op is not None:
        return resolve_op(op)
    return ReduceOp.SUM if average is False else ReduceOp.AVERAGE


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = None) -> torch.Tensor:
    """Reduces `tensor` across the ranks in place, as ``hvd.allreduce_``.

    Every rank (of the process set) calls it with a tensor of the same shape and dtype, at the
    same point of its program.

    Args:
        tensor: the tensor to reduce; it holds the result afterwards.
        average: Horovod's older flag: True for the mean, False for the sum; None: `op` decides.
        name: accepted for Horovod's signature and ignored: commsched matches collectives by
            the order of the calls.
        op: ``commsched.Average`` (the default) or ``commsched.Sum`` (or Horovod's).
        prescale_factor: multiplies `tensor` before the reduction.
        postscale_factor: multiplies the result after it (and after the mean's division).
        process_set: an ``hvd.ProcessSet`` or a list of global ranks; only its members call
            it. None: the whole world.

    Returns:
        `tensor`, reduced.

    Raises:
        ValueError: `op` and `average` both given, ``op=Adasum``, the mean of an integer
            tensor (reduce with Sum and divide yourself), or this rank is not in `process_set`.
        RuntimeError: torch.distributed's all-reduce failed or timed out (in an elastic
            Horovod job: RankFailureError, which is Horovod's HorovodInternalError).
    """
    del name
    reduce = _reduce_op(average, op)
    if reduce is ReduceOp.AVERAGE and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"commsched.allreduce: the mean of a {tensor.dtype} tensor is not an "
                         "integer; use op=commsched.Sum and divide by commsched.size()")
    world = _world_of(process_set, "allreduce")
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    if world.size > 1:
        world.run("a collective", dist.all_reduce, tensor, group=_group(world, tensor))
    scale = postscale_factor / (world.size if reduce is ReduceOp.AVERAGE else 1)
    if scale != 1.0:
        tensor.mul_(scale)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """The reduction of `tensor` across the ranks, as ``hvd.allreduce``: a new tensor.

    ``commsched.allreduce(torch.tensor(loss.item()))`` is the mean of every rank's loss.

    Args:
        tensor: this rank's value; it is left as it is.
        average: Horovod's older flag: True for the mean, False for the sum; None: `op` decides.
        name: accepted for Horovod's signature and ignored.
        op: ``commsched.Average`` (the default) or ``commsched.Sum`` (or Horovod's).
        prescale_factor: multiplies each rank's value before the reduction.
        postscale_factor: multiplies the result after it.
        process_set: an ``hvd.ProcessSet`` or a list of global ranks; only its members call
            it. None: the whole world.

    Returns:
        A new tensor of `tensor`'s shape, dtype and device holding the result.

    Raises:
        ValueError: what allreduce_() raises.
        RuntimeError: torch.distributed's all-reduce failed or timed out.
    """
    return allreduce_(tensor.detach().clone(), average, name, op, prescale_factor,
                      postscale_factor, process_set)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along the first dimension, as ``hvd.allgather``.

    Rank 0's rows come first. The first dimension may differ between ranks (a rank's
    predictions of its own batch); the others and the dtype must not.

    Args:
        tensor: this rank's part; a 0-dimensional tensor counts as one row.
        name: accepted for Horovod's signature and ignored.
        process_set: an ``hvd.ProcessSet`` or a list of global ranks; only its members call
            it. None: the whole world.

    Returns:
        A new tensor: every rank's rows, rank 0's first.

    Raises:
        ValueError: the ranks' tensors differ in dtype or in a dimension after the first (the
            message names the ranks, on every rank), or this rank is not in `process_set`.
        RuntimeError: torch.distributed's all-gather failed or timed out.
    """
    del name
    world = _world_of(process_set, "allgather")
    part = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    if world.size == 1:
        return part.clone()
    shapes = world.all_gather_object((tuple(part.shape), str(part.dtype)))
    _check_parts(shapes, world)
    rows = max(shape[0] for shape, _ in shapes)
    padded = part.new_zeros((rows, *part.shape[1:]))
    padded[:part.shape[0]] = part
    gathered = [torch.empty_like(padded) for _ in range(world.size)]
    world.run("a collective", dist.all_gather, gathered, padded.contiguous(),
              group=_group(world, part))
    return torch.cat([g[:shape[0]] for g, (shape, _) in zip(gathered, shapes, strict=True)])


def _check_parts(shapes: list[tuple[tuple[int, ...], str]], world: World) -> None:
    first_shape, first_dtype = shapes[0]
    for rank, (shape, dtype) in enumerate(shapes):
        if dtype != first_dtype or shape[1:] != first_shape[1:]:
            raise ValueError(
                f"commsched.allgather: rank {world.global_rank(rank)} gives a {dtype} tensor of "
                f"shape {list(shape)}, rank {world.global_rank(0)} a {first_dtype} tensor of "
                f"shape {list(first_shape)}: only the first dimension may differ")


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = None) -> torch.Tensor:
    """Copies `root_rank`'s `tensor` into every rank's, in place, as ``hvd.broadcast_``.

    Args:
        tensor: the root's value, or on the other ranks a tensor of the same shape and dtype
            to receive it.
        root_rank: the global rank that sends, also within a process set (as in Horovod).
        name: accepted for Horovod's signature and ignored.
        process_set: an ``hvd.ProcessSet`` or a list of global ranks; only its members call
            it. None: the whole world.

    Returns:
        `tensor`, holding the root's value.

    Raises:
        ValueError: `root_rank` is not in the world or in `process_set`, or this rank is not
            in `process_set`.
        RuntimeError: torch.distributed's broadcast failed or timed out.
    """
    del name
    world = _world_of(process_set, "broadcast")
    whole = world.parent or world
    if not 0 <= root_rank < whole.size:
        raise ValueError(f"commsched.broadcast: root_rank {root_rank} is not a rank of the "
                         f"world of {whole.size}")
    root_within(world, root_rank)
    if world.size > 1:
        world.run("a collective", dist.broadcast, tensor, src=root_rank,
                  group=_group(world, tensor))
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """`root_rank`'s `tensor` on every rank, as ``hvd.broadcast``: a new tensor.

    Args:
        tensor: the root's value, or on the other ranks a tensor of the same shape and dtype.
        root_rank: the global rank that sends.
        name: accepted for Horovod's signature and ignored.
        process_set: an ``hvd.ProcessSet`` or a list of global ranks; only its members call
            it. None: the whole world.

    Returns:
        A new tensor holding the root's value; `tensor` is left as it is.

    Raises:
        ValueError: what broadcast_() raises.
        RuntimeError: torch.distributed's broadcast failed or timed out.
    """
    return broadcast_(tensor.detach().clone(), root_rank, name, process_set)
