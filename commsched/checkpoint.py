"""Checkpoint files that a killed run never leaves half-written.

A job restarted by ``torchrun --max-restarts`` (or by hand) resumes from the last checkpoint,
so that file must be whole whenever the job dies, including while it is being written::

    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
    commsched.checkpoint.save("run.ckpt", state)        # every rank calls; rank 0 writes
    ...
    state = commsched.checkpoint.load("run.ckpt")      # None before the first save

Note [Whole or refused]
`save` writes the file beside its destination under a temporary name, flushes it to disk and
renames it over the destination: a rename within one directory is atomic, so a reader sees the
previous checkpoint or the new one, never a part. The file starts with a header (a magic
string, the payload's length and its SHA-256): `load` refuses a file whose length or digest
does not match, naming the path and what is wrong, instead of letting torch fail somewhere in
its zip reader or load silently damaged tensors. A temporary file left by a writer killed
mid-write is never read, and the next save replaces it.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from typing import Any

import torch

from .world import bootstrap

MAGIC = b"CSCKPT01"
_HEADER = struct.Struct(f"<{len(MAGIC)}sQ32s")  # magic, payload length, SHA-256 of payload


class CheckpointError(ValueError):
    """A checkpoint file that is not whole: truncated, altered, or not one of ours."""


def save(path: str, state: dict[str, Any], rank: int | None = None) -> None:
    """Writes `state` to `path` atomically (Note [Whole or refused]).

    Every rank may call it (its optimizer's ``state_dict()`` may be a collective, as with
    ``shard_optimizer=True``): rank 0 writes, the others return.

    Args:
        path: the checkpoint file; its directory must exist.
        state: what to save (tensors, state dicts, numbers).
        rank: this process's rank; by default commsched's (commsched.init(): the launcher's
            world, formed here if no wrap or broadcast formed it yet; 0 outside a job).

    Raises:
        OSError: the file could not be written (the previous checkpoint is left as it was).
    """
    if (bootstrap.init().rank if rank is None else rank) != 0:
        return
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(header)
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    _sync_directory(directory)


def load(path: str, map_location: Any = "cpu") -> dict[str, Any] | None:
    """Reads a checkpoint that save() wrote.

    Args:
        path: the checkpoint file.
        map_location: as torch.load's.

    Returns:
        The saved state; None where there is no file yet (a first run).

    Raises:
        CheckpointError: the file is truncated, altered, or was not written by save().
    """
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < _HEADER.size or not data.startswith(MAGIC):
        raise CheckpointError(f"commsched: {path} is not a commsched checkpoint (no "
                              f"{MAGIC.decode()} header in its {len(data)} bytes): write it "
                              "with commsched.checkpoint.save")
    _, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise CheckpointError(f"commsched: checkpoint {path} is truncated: {len(payload)} of "
                              f"its {length} bytes (a copy cut short, or a disk that filled "
                              "up); use an earlier checkpoint")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"commsched: checkpoint {path} is damaged: its {length} bytes do "
                              "not match the digest saved with them; use an earlier checkpoint")
    state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"commsched: checkpoint {path} holds a {type(state).__name__}, "
                              "not the dict save() writes")
    return state


def _sync_directory(directory: str) -> None:
    """Makes the rename itself durable (a crash of the machine, not only of the process)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
