"""The factors' way out of the model's passes: the preconditioner's layer hooks.

On a factor-update step a forward hook computes each preconditioned layer's A from its input and
registers an output-gradient hook that computes G; each factor leaves for the factor exchange as
soon as it exists (or is held until step(), unpipelined, for comparison).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import factors as fx
from .binding import FactorWorld


class FactorCapture:
    """The forward and output-gradient hooks of the preconditioned layers, and what they computed.

    Attributes:
        pipelined: whether a factor goes to the exchange as soon as it is computed.
        grad_scaler: the loss scale's source that G is divided by, or None.
    """

    def __init__(self, layers: list[tuple[str, nn.Module]], parts: Callable[[], FactorWorld],
                 updating: Callable[[], bool], dtype: torch.dtype, pipelined: bool,
                 grad_scaler: Any) -> None:
        """Hooks each (name, module) of `layers`.

        Args:
            layers: the preconditioned layers' names and modules.
            parts: the world's parts of now, whose factor exchange averages the factors across
                ranks (and whether only their upper triangles travel); asked per factor, since
                an elastic job's first factor of a step may bind to a re-formed world.
            updating: whether this step updates the factors (asked in each forward pass).
            dtype: the factors' dtype.
            pipelined: hand each factor over as soon as it is computed; False holds them until
                hand_over().
            grad_scaler: a ``torch.amp.GradScaler``, or a callable returning the loss scale;
                None without loss scaling.
        """
        self.parts = parts
        self.updating = updating
        self.dtype, self.pipelined = dtype, pipelined
        self.grad_scaler = grad_scaler
        self.held: dict[str, torch.Tensor] = {}  # unpipelined: factors kept until step()
        self.computed: set[str] = set()  # factors computed since the last step()
        self.hooks = [module.register_forward_hook(functools.partial(self._forward_hook, name))
                      for name, module in layers]

    def _forward_hook(self, layer: str, module: nn.Module, inputs: tuple, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled() and self.updating()):
            return
        name = f"{layer}.A"
        if name not in self.computed:
            x = inputs[0]
            with torch.autocast(x.device.type, enabled=False):
                factor = fx.a_factor(module, x.to(self.dtype))
            if factor is not None:
                self._submit(name, factor)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(functools.partial(self._output_grad_hook, layer, module))

    def _output_grad_hook(self, layer: str, module: nn.Module, grad: torch.Tensor) -> None:
        name = f"{layer}.G"
        if name in self.computed:
            return
        grad = grad.to(self.dtype)
        if self.grad_scaler is not None:  # G of the unscaled loss
            scaler = self.grad_scaler
            scale = scaler() if callable(scaler) else scaler.get_scale()
            grad = grad / float(scale)
        with torch.autocast(grad.device.type, enabled=False):
            factor = fx.g_factor(module, grad)
        if factor is not None:
            self._submit(name, factor)

    def _submit(self, name: str, factor: torch.Tensor) -> None:
        # A layer run twice in one step contributes its first input and the first output
        # gradient to arrive (activation checkpointing recomputes the very same input).
        parts = self.parts()
        self.computed.add(name)
        flat = fx.pack_upper(factor) if parts.pack else factor.reshape(-1).contiguous()
        if self.pipelined:
            parts.factors.submit(name, flat)
        else:
            self.held[name] = flat

    def hand_over(self) -> None:
        """Ends the step's capture: held (unpipelined) factors go to the exchange now."""
        if not self.pipelined:  # all factors handed over only now, for comparison
            held, self.held = self.held, {}
            exchange = self.parts().factors
            for name in exchange.factor_names:  # in the plan's ready order
                if name in held:
                    exchange.submit(name, held[name])
        self.computed.clear()

    def forget(self) -> None:
        """Drops what the passes since the last step() computed (an elastic job's restore)."""
        self.held, self.computed = {}, set()

    def remove(self) -> None:
        """Removes the layer hooks."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
