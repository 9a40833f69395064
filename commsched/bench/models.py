"""The models the benchmarks train, with synthetic data: the built-in ones, sized so that a
2-rank CPU run is communication-bound on a shaped 1 Gbit/s loopback and still finishes an
iteration in well under a second, the real architectures of `real_models`, and a user's own
(`any_model`: hf:<transformers model type>?..., tv:<torchvision model>?...), and a replay of
a device's compute profile (`profile_model`: profile:<path>?k=<byte scale>)."""

from __future__ import annotations

import argparse
import enum
from typing import Any

import torch
from torch import nn

from . import any_model, profile_model, real_models
from .any_model import ModelSpec
from .profile_model import ProfileModel, ProfileSpec
from .real_models import RealModel


class ModelName(enum.StrEnum):
    CNN = "cnn"
    TRANSFORMER = "transformer"
    MLP = "mlp"


AnyModel = ModelName | RealModel | ModelSpec | ProfileSpec

MODEL_CHOICES: list[ModelName | RealModel] = [*ModelName, *RealModel]


def model_name(text: str) -> AnyModel:
    """A built-in model's or a real architecture's name, a user's model as
    ``hf:<transformers model type>?key=value&...`` or ``tv:<torchvision model>?...``, or a
    compute profile replayed as ``profile:<path>?k=<byte scale>`` (`model_argument` is this
    for argparse).

    Args:
        text: the name or the spec.

    Returns:
        The model's name or spec.

    Raises:
        ValueError: none of those, a transformers config without a field it overrides, or a
            profile that cannot be read.
        ImportError: an ``hf:`` model without `transformers`.
    """
    if text.startswith(profile_model.PROFILE_PREFIX):
        return ProfileSpec.parse(text)
    if text.startswith((any_model.HF_PREFIX, any_model.TV_PREFIX)):
        spec = ModelSpec.parse(text)
        if spec.source == any_model.HF_PREFIX:
            spec.config()  # a field the model has not is refused now, before any training
        return spec
    for choice in MODEL_CHOICES:
        if text == choice.value:
            return choice
    raise ValueError(f"model {text!r}: choose from {', '.join(c.value for c in MODEL_CHOICES)}, "
                     "or name your own as hf:<transformers model type>?key=value&... or "
                     "tv:<torchvision model>?key=value&...")


def model_argument(text: str) -> AnyModel:
    """`model_name` as argparse's `type=`, which prints an ArgumentTypeError's text (and only
    "invalid value" for a ValueError)."""
    try:
        return model_name(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class SmallCNN(nn.Module):
    """VGG-style: a few conv stages, then a wide classifier that carries most parameters (like
    VGG-16, whose fully connected layers hold most of its bytes)."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        chans = [3, width, 2 * width, 4 * width]
        layers: list[nn.Module] = []
        for cin, cout in zip(chans, chans[1:], strict=False):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                       nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(4 * width * 4 * 4, 1024), nn.ReLU(),
                                        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class SmallTransformer(nn.Module):
    """A GPT-like encoder stack with a tied embedding / output projection."""

    def __init__(self, vocab: int = 4096, dim: int = 256, layers: int = 4, heads: int = 4,
                 seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.pos[: tokens.shape[1]]))


class SmallMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build(name: AnyModel, seed: int = 0) -> nn.Module:
    if isinstance(name, ProfileSpec):
        return name.build(seed)
    if isinstance(name, ModelSpec):
        return any_model.build(name, seed)
    if isinstance(name, RealModel):
        return real_models.build(name, seed)
    torch.manual_seed(seed)
    if name is ModelName.CNN:
        return SmallCNN()
    if name is ModelName.TRANSFORMER:
        return SmallTransformer()
    return SmallMLP()


def batch(name: AnyModel, batch_size: int, step: int,
          rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(name, ProfileSpec):
        return profile_model.replay_batch(batch_size, step, rank)
    if isinstance(name, ModelSpec):
        return any_model.batch(name, batch_size, step, rank)
    if isinstance(name, RealModel):
        return real_models.batch(name, batch_size, step, rank)
    gen = torch.Generator().manual_seed(10_000 * rank + step)
    if name is ModelName.CNN:
        return (torch.randn(batch_size, 3, 32, 32, generator=gen),
                torch.randint(0, 10, (batch_size,), generator=gen))
    if name is ModelName.TRANSFORMER:
        tokens = torch.randint(0, 4096, (batch_size, 65), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]
    return (torch.randn(batch_size, 64, generator=gen),
            torch.randint(0, 10, (batch_size,), generator=gen))


def loss_fn(name: AnyModel, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if isinstance(name, ProfileSpec):
        return profile_model.replay_loss(output, target)
    if isinstance(name, ModelSpec):
        return any_model.loss_fn(name, output, target)
    if isinstance(name, RealModel):
        return real_models.loss_fn(name, output, target)
    if name is ModelName.TRANSFORMER:
        return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())
    return nn.functional.cross_entropy(output, target)


def optimizer_class(model: nn.Module,
                    base: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """The optimizer class a benchmark steps `model` with (unwrapped from DDP): `base`, or for a
    replayed profile `base` sleeping the replayed device's update time."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if isinstance(inner, ProfileModel):
        return profile_model.sleeping_optimizer(base, inner.profile.update_s,
                                                sum(p.numel() for p in inner.parameters()))
    return base


# torch DDP's default bucket capacity (DistributedDataParallel's bucket_cap_mb).
DDP_BUCKET_MB = 25


def ddp_bucket_kwargs(name: AnyModel) -> dict[str, Any]:
    """DistributedDataParallel's bucket arguments for `name`: its defaults, but a replayed
    profile's gradients are k times smaller, so its buckets are too (the real model's buckets,
    each scaled by k, in the real model's number)."""
    if isinstance(name, ProfileSpec) and name.scale > 1:
        return {"bucket_cap_mb": DDP_BUCKET_MB / name.scale}
    return {}
