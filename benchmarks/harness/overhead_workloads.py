"""What the overhead benchmark trains: the built-in models, and GPT-2 124M from its
configuration where `transformers` is importable (benchmarks/harness/overhead.py measures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from commsched.bench.models import ModelName, batch, build, loss_fn, model_name
from commsched.bench.profile_model import PROFILE_PREFIX, ProfileSpec

from . import gpt2_layout
from .overhead_report import GPT2, GPT2_LAYOUT


@dataclass
class Workload:
    name: str
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[int], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor]


def builtin(name: ModelName, device: torch.device, batch_size: int) -> Workload:
    def make_batch(step: int) -> tuple[Any, Any]:
        x, y = batch(name, batch_size, step, rank=0)
        return x.to(device), y.to(device)
    return Workload(name.value, lambda: build(name).to(device), make_batch,
                    lambda out, y: loss_fn(name, out, y))


def gpt2(device: torch.device, batch_size: int, seq: int) -> Workload:
    """GPT-2 124M from its configuration (random weights: nothing is downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def make_model() -> nn.Module:
        torch.manual_seed(0)
        model: nn.Module = GPT2LMHeadModel(GPT2Config())
        return model.to(device)

    def make_batch(step: int) -> tuple[Any, Any]:
        gen = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, 50257, (batch_size, seq), generator=gen).to(device)
        return tokens, tokens

    def loss(out: Any, tokens: Any) -> torch.Tensor:
        return out.loss

    class Wrapper(nn.Module):  # the LM computes its loss from labels=
        def __init__(self) -> None:
            super().__init__()
            self.lm = make_model()

        def forward(self, tokens: torch.Tensor) -> Any:
            return self.lm(tokens, labels=tokens)

    return Workload(GPT2, Wrapper, make_batch, loss)


def layout_of_gpt2(device: torch.device, batch_size: int) -> Workload:
    """GPT-2's parameter layout at width 32 (Note [A host-bound step on a CPU])."""
    def make_model() -> nn.Module:
        torch.manual_seed(0)
        return gpt2_layout.Gpt2Layout().to(device)
    return Workload(GPT2_LAYOUT, make_model,
                    lambda step: gpt2_layout.make_batch(step, batch_size, device),
                    lambda loss, tokens: loss)


def replayed(text: str, device: torch.device, batch_size: int) -> Workload:
    """A device's compute replayed from a profile (`profile:PATH?k=...`): the model's tensors
    and module order with sleeps in place of its math, stepped by an optimizer that sleeps the
    device's update (Note [Replaying a device's compute]). A world of one at the device's pace
    shows what commsched's own work adds where compute takes milliseconds, not seconds."""
    spec = model_name(text)
    if not isinstance(spec, ProfileSpec):
        raise ValueError(f"{text!r} is no replayed profile ({PROFILE_PREFIX}PATH?k=...)")

    def make_batch(step: int) -> tuple[Any, Any]:
        x, y = batch(spec, batch_size, step, rank=0)
        return x.to(device), y.to(device)
    return Workload(text, lambda: build(spec).to(device), make_batch,
                    lambda out, y: loss_fn(spec, out, y))


MODELS = (GPT2, GPT2_LAYOUT, *(name.value for name in ModelName))  # the built-in ones only


def workload(name: str, device: torch.device, batch_size: int = 0) -> Workload | None:
    """The named model's workload (`batch_size` 0: 16 per step, the Transformer 8, GPT-2's
    layout 1 x 64 tokens; GPT-2 always 8 x 512), or None for GPT-2 where `transformers` is not
    importable."""
    if name.startswith(PROFILE_PREFIX):
        return replayed(name, device, batch_size or 1)
    if name == GPT2_LAYOUT:
        return layout_of_gpt2(device, batch_size or 1)
    if name == GPT2:
        try:
            return gpt2(device, 8, 512)
        except ImportError:
            return None
    model_name = ModelName(name)
    return builtin(model_name, device,
                   batch_size or (8 if model_name is ModelName.TRANSFORMER else 16))
