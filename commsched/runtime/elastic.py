"""A session's side of elastic Horovod (Note [Elastic Horovod] in world/bootstrap.py): what an
elastic job refuses at wrap time. Whether a session's world went stale, and re-binding to the
world of now, are the session's own (runtime/session.py)."""

from __future__ import annotations

from ..config import Config
from .wrap import WrapOptions


def refuse_in_elastic_job(config: Config, options: WrapOptions) -> None:
    """Raises ValueError for what an elastic Horovod job cannot restore after losing a worker."""
    if config.policy.overlaps_iterations:
        raise ValueError(f"commsched: policy '{config.policy.value}' applies updates in the "
                         "next forward pass, which an elastic Horovod job cannot restore "
                         "after losing a worker; use a synchronous policy (horovod, ddp, "
                         "mgwfbp, or auto, which then chooses among them)")
    if options.process_set is not None:
        raise ValueError("commsched: process_set= in an elastic Horovod job is not supported: "
                         "its ranks are re-numbered when the world is re-formed")
    if options.lossy is not None:
        raise ValueError("commsched: PowerSGD and top-k keep per-rank error-feedback state "
                         "that an elastic Horovod job cannot re-form after losing a worker; "
                         "use compression none, fp16 or bf16 there")
