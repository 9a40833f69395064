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
from .exchange import FactorExchange


class FactorCapture:
    """The forward and output-gradient hooks of the preconditioned layers, and what they computed.

    Attributes:
        pipelined: whether a factor goes to the exchange as soon as it is computed.
        grad_scaler: the loss scale's source that G is divided by, or None.
    """

    def __init__(self, layers: list[tuple[str, nn.Module]], exchange: FactorExchange,
                 updating: Callable[[], bool], dtype: torch.dtype, pack: bool, pipelined: bool,
                 grad_scaler: Any) -> None:
        """Hooks each (name, module) of `layers`.

        Args:
            layers: the preconditioned layers' names and modules.
            exchange: where the factors are averaged across ranks.
            updating: whether this step updates the factors (asked in each forward pass).
            dtype: the factors' dtype.
            pack: send only the upper triangles of the symmetric factors.
            pipelined: hand each factor over as soon as it is computed; False holds them until
                hand_over().
            grad_scaler: a ``torch.amp.GradScaler``, or a callable returning the loss scale;
                None without loss scaling.
        """
        self.exchange = exchange
        self.updating = updating
        self.dtype, self.pack, self.pipelined = dtype, pack, pipelined
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
        self.computed.add(name)
        flat = fx.pack_upper(factor) if self.pack else factor.reshape(-1).contiguous()
        if self.pipelined:
            self.exchange.submit(name, flat)
        else:
            self.held[name] = flat

    def hand_over(self) -> None:
        """Ends the step's capture: held (unpipelined) factors go to the exchange now."""
        if not self.pipelined:  # all factors handed over only now, for comparison
            held, self.held = self.held, {}
            for name in self.exchange.factor_names:  # in the plan's ready order
                if name in held:
                    self.exchange.submit(name, held[name])
        self.computed.clear()

    def remove(self) -> None:
        """Removes the layer hooks."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
