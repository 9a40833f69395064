"""commsched.lightning: a Lightning ``Strategy`` that trains on commsched's engine.

``Trainer(strategy=CommschedStrategy(policy="auto"))``, launched with ``torchrun``, trains as
Lightning's DDP strategy does, except that the model is not wrapped in DDP: each optimizer is
wrapped in ``commsched.DistributedOptimizer`` instead, and its policy schedules the gradient
traffic. Lightning's own collectives (logging with ``sync_dist``, the sampler, checkpoints,
barriers) stay on torch.distributed's default group, which commsched shares. Lightning is an
optional extra: ``pip install --no-build-isolation '.[lightning]'`` in commsched's checkout, or
``pip install 'lightning>=2.2'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .optimizer import DistributedOptimizer, _DistributedOptimizer
from .world import bootstrap
from .world.broadcast import broadcast_optimizer_state, broadcast_parameters

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.utilities import GradClipAlgorithmType
except ImportError as _err:  # an optional extra: say how to get it
    raise ImportError(
        "commsched.lightning needs Lightning 2.x (the `lightning` package), which is not "
        f"importable here ({_err}): pip install 'lightning>=2.2' (or, in commsched's checkout, "
        "pip install --no-build-isolation '.[lightning]')") from _err

__all__ = ["CommschedStrategy"]


class _UnscaledMixedPrecision(MixedPrecision):
    """MixedPrecision whose clipping knows the gradients are unscaled when it runs.

    Lightning refuses to clip for an optimizer that takes GradScaler's step itself (fused Adam,
    and commsched's wrapper, which reports ``_step_supports_amp_scaling``), because such an
    optimizer unscales later. CommschedStrategy averages and unscales before the hooks and
    clipping run, so clipping is the plain one.
    """

    def clip_gradients(self, optimizer: Any, clip_val: int | float = 0.0,
                       gradient_clip_algorithm: Any = GradClipAlgorithmType.NORM) -> None:
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)


class CommschedStrategy(DDPStrategy):
    """Lightning's data-parallel strategy with commsched's engine in place of DDP's reducer.

    One process per device, started by ``torchrun`` (or Lightning's own launcher, SLURM, ...),
    as with ``strategy="ddp"``: Lightning's cluster environment gives the ranks and its
    distributed sampler splits the data. The model stays unwrapped; at ``fit`` each optimizer
    from ``configure_optimizers`` is wrapped in ``commsched.DistributedOptimizer`` with the
    LightningModule's parameter names and ``model=`` (so the overlap policies and ``auto``
    may hook its forward pass), then rank 0's parameters and optimizer state are broadcast.
    Under ``torchrun`` commsched's own bootstrap makes torch.distributed's default group and
    Lightning reuses it; otherwise commsched adopts the group Lightning made.

    Each step runs Lightning's closure (forward, ``zero_grad``, backward) first. Under a
    synchronous plan, or with gradient clipping or a ``16-mixed`` GradScaler, the gradients are
    then averaged (``synchronize()``) before ``on_before_optimizer_step``, clipping and the
    scaler see them, and the optimizer steps on them, as under DDP. Under an overlap plan with
    neither, ``step()`` leaves each update to the next forward pass (docs/policies.md), and
    ``on_before_optimizer_step`` sees this rank's own gradients. ``accumulate_grad_batches``
    runs the accumulating micro-batches inside the optimizers' ``no_sync()``.
    """

    _DDP_ARGUMENTS = frozenset({"accelerator", "parallel_devices", "cluster_environment",
                                "checkpoint_io", "precision_plugin", "process_group_backend",
                                "timeout", "start_method"})

    def __init__(self, policy: str | None = None, optimizer_kwargs: dict[str, Any] | None = None,
                 overlap_model: bool = True, **kwargs: Any) -> None:
        """Keeps the settings; nothing joins the world before the Trainer starts.

        Args:
            policy: the scheduling policy (``"horovod"``, ``"ddp"``, ``"mgwfbp"``,
                ``"bytescheduler"``, ``"prophet"``, ``"dear"``, ``"auto"``); None leaves it to
                ``COMMSCHED_POLICY`` and the other sources of the knob.
            optimizer_kwargs: other arguments of ``DistributedOptimizer`` (``compression``,
                ``op``, ``groups``, ``backward_passes_per_step``, ...), for every optimizer.
            overlap_model: pass the LightningModule as ``model=`` (needed by the overlap policies,
                and by ``auto`` to consider them); False: the synchronous policies only.
            **kwargs: knobs by their lower-case names (``profile_steps=2``,
                ``fusion_threshold="64MiB"``), passed to ``DistributedOptimizer``; and the
                arguments of Lightning's ``DDPStrategy`` that still apply (``accelerator``,
                ``parallel_devices``, ``cluster_environment``, ``checkpoint_io``,
                ``precision_plugin``, ``process_group_backend``, ``timeout``, ``start_method``).
        """
        ddp_kwargs = {k: v for k, v in kwargs.items() if k in self._DDP_ARGUMENTS}
        super().__init__(**ddp_kwargs)
        self._cs_kwargs: dict[str, Any] = {**(optimizer_kwargs or {}), "policy": policy,
                                           **{k: v for k, v in kwargs.items()
                                              if k not in self._DDP_ARGUMENTS}}
        self._cs_overlap_model = overlap_model

    # -- the world ------------------------------------------------------------------------------

    def setup_distributed(self) -> None:
        """Joins the world: commsched's torchrun bootstrap, or adopts Lightning's group.

        Raises:
            RuntimeError: commsched's world (its rank and size) is not Lightning's.
        """
        if isinstance(self.cluster_environment, TorchElasticEnvironment) \
                and self._process_group_backend is None \
                and not torch.distributed.is_initialized():
            bootstrap.init()  # env:// under torchrun, in its attempt's namespace on restarts
        super().setup_distributed()  # Lightning's ranks and seed; reuses an existing group
        world = bootstrap.init()
        if (world.rank, world.size) != (self.global_rank, self.world_size):
            raise RuntimeError(
                f"commsched's world (rank {world.rank} of {world.size}) is not Lightning's "
                f"(rank {self.global_rank} of {self.world_size})")

    def configure_ddp(self) -> None:
        """Leaves the model unwrapped: the optimizers average the gradients instead."""

    # -- the optimizers -------------------------------------------------------------------------

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """Wraps each optimizer in ``DistributedOptimizer`` and broadcasts rank 0's state.

        The LR schedulers of ``configure_optimizers`` are pointed at the wrappers.

        Args:
            trainer: the Trainer that is fitting.
        """
        super().setup_optimizers(trainer)
        module = self.lightning_module
        assert module is not None
        broadcast_parameters(module.state_dict(), root_rank=0)
        wrapped: list[torch.optim.Optimizer] = []
        for optimizer in self.optimizers:
            if isinstance(optimizer, _DistributedOptimizer):
                wrapped.append(optimizer)
                continue
            mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
            named = [(n, p) for n, p in module.named_parameters() if id(p) in mine]
            model = module if self._cs_overlap_model else None
            opt = DistributedOptimizer(optimizer, named_parameters=named, model=model,
                                       **self._cs_kwargs)
            broadcast_optimizer_state(opt, root_rank=0, model=module)
            self._rebind_schedulers(optimizer, opt)
            wrapped.append(opt)
        self.optimizers = wrapped

    def setup_precision_plugin(self) -> None:
        """Lightning's, with clipping under mixed precision allowed (_UnscaledMixedPrecision)."""
        if type(self.precision_plugin) is MixedPrecision:
            self.precision_plugin.__class__ = _UnscaledMixedPrecision
        super().setup_precision_plugin()

    def _rebind_schedulers(self, original: torch.optim.Optimizer,
                           wrapped: _DistributedOptimizer) -> None:
        """Points `original`'s LR schedulers at the wrapper.

        The wrapper starts with `original`'s param groups, but a load_state_dict() (the
        broadcast on ranks other than 0, a checkpoint's restore) replaces its groups: a
        scheduler left on `original` would then set learning rates nobody steps with.
        """
        for config in self.lr_scheduler_configs:
            scheduler = config.scheduler
            if getattr(scheduler, "optimizer", None) is not original:
                continue
            scheduler.optimizer = wrapped
            # torch checks once, at the scheduler's first step, that the optimizer it patched
            # at construction (`original`) stepped before it; the wrapper steps instead.
            if getattr(scheduler, "_step_count", None) == 1:
                scheduler._step_count = 2  # type: ignore[union-attr]

    def _wrapped(self) -> list[_DistributedOptimizer]:
        return [opt for opt in self.optimizers if isinstance(opt, _DistributedOptimizer)]

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any],
                       model: Any = None, **kwargs: Any) -> Any:
        """Runs Lightning's closure, averages the gradients, then steps (see the class).

        Args:
            optimizer: a wrapped optimizer of this strategy.
            closure: Lightning's closure: the training step, ``zero_grad`` and backward.
            model: the LightningModule (Lightning's argument).
            **kwargs: passed to ``optimizer.step``.

        Returns:
            The closure's result (the loss), as Lightning's strategies return it.
        """
        if not isinstance(optimizer, _DistributedOptimizer):
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        module = model if model is not None else self.lightning_module
        assert isinstance(module, pl.LightningModule)
        result = closure()  # outside step(): commsched times the update apart from compute
        precision = self.precision_plugin
        if isinstance(precision, MixedPrecision) and precision.scaler is not None:
            # Horovod's recipe: average, unscale, then the scaler's step on those gradients.
            optimizer.synchronize()
            if result is not None or not module.automatic_optimization:
                precision.scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                precision.optimizer_step(optimizer, model=module, closure=lambda: result,
                                         **kwargs)
            return result
        if type(precision).optimizer_step not in (Precision.optimizer_step,
                                                  MixedPrecision.optimizer_step):
            raise NotImplementedError(
                f"commsched.lightning: precision plugin {type(precision).__name__} has its own "
                "optimizer_step; supported: Precision and MixedPrecision (32, 16, bf16)")
        defer = optimizer.session.mode.defers_updates and not module.trainer.gradient_clip_val
        if not defer:
            optimizer.synchronize()
        precision._after_closure(module, optimizer)  # the hooks and clipping, as Precision
        with contextlib.nullcontext() if defer else optimizer.skip_synchronize():
            optimizer.step(**kwargs)  # deferred: the update lands in the next forward pass
        return result

    @contextlib.contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Gradient accumulation: Lightning's accumulating micro-batches run in ``no_sync()``.

        Yields:
            Nothing; the block runs one accumulating micro-batch.
        """
        with contextlib.ExitStack() as stack:
            for optimizer in self._wrapped():
                stack.enter_context(optimizer.no_sync())
            yield

    # -- pauses and the end ---------------------------------------------------------------------

    def _flush(self) -> None:
        for optimizer in self._wrapped():
            optimizer.flush()

    def on_validation_start(self) -> None:
        """Applies the updates an overlap plan defers before an evaluation (no training forward)."""
        self._flush()
        super().on_validation_start()

    def on_train_end(self) -> None:
        """Applies the last step's deferred updates, so the module holds the final parameters."""
        self._flush()
        super().on_train_end()

    def teardown(self) -> None:
        """Applies deferred updates, then Lightning's teardown; commsched's world stays up.

        The world serves the next ``fit``/``validate``/``test`` of the script; call
        ``commsched.shutdown()`` at its end.
        """
        self._flush()
        super().teardown()
