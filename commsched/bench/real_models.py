"""The architectures users train: ResNet-50 and VGG-16 (torchvision's layout), BERT-base and
GPT-2 124M (`transformers`, built from their configurations: random weights, nothing
downloaded), with synthetic inputs.

Note [Full gradients, reduced inputs]
A schedule's work is set by the gradients: their count, sizes and order, and when backward makes
each one. Those are the real models' own here, at full size. Only the inputs are reduced, so that
a step fits a CPU core in about a second: images of 64 x 64 pixels for ResNet-50 and 32 x 32 for
VGG-16 (its adaptive pooling keeps the classifier's 25088 inputs), sequences of 64 tokens for BERT
and GPT-2. A smaller input shortens compute against the same traffic, so a run here is more
communication-bound than a GPU's at full resolution would be at the same link speed; the
benchmark scripts shape the link so that `hvd` waits on communication for 40-70% of its
iteration, the range a GPU cluster's bottleneck network gives. On a GPU the inputs are the ones
these models train on (`Inputs.FULL`: 224 x 224 images, 128 tokens for BERT as in its first
pre-training phase, GPT-2's 1024-token context).
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import nn

from . import vision

CLASSES = 1000


class Inputs(enum.StrEnum):
    """How large one sample is (Note [Full gradients, reduced inputs])."""

    REDUCED = "reduced"  # a CPU core's step in about a second
    FULL = "full"  # what the model trains on, for a GPU


IMAGE_SIDE = {Inputs.REDUCED: {"resnet50": 64, "vgg16": 32},
              Inputs.FULL: {"resnet50": 224, "vgg16": 224}}
SEQUENCE = {Inputs.REDUCED: {"bert": 64, "gpt2": 64}, Inputs.FULL: {"bert": 128, "gpt2": 1024}}


class RealModel(enum.StrEnum):
    RESNET50 = "resnet50"
    VGG16 = "vgg16"
    BERT = "bert"
    GPT2 = "gpt2"


class _LanguageModel(nn.Module):
    """A `transformers` model whose forward takes token ids and returns logits, so that it steps
    as the built-in models do. Holding it as `lm` prefixes its parameter names with ``lm.``."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm(input_ids=tokens).logits
        return logits


def import_transformers(what: str) -> Any:
    """`transformers`, or an ImportError saying that `what` needs it and how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{what} is built by `transformers`: "
                          "pip install 'transformers>=4.40' (or, in commsched's "
                          "checkout, pip install --no-build-isolation '.[examples]')") from err
    return transformers


def _language_model(name: RealModel) -> nn.Module:
    transformers = import_transformers(f"the {name.value} model")
    if name is RealModel.BERT:
        return transformers.BertForMaskedLM(transformers.BertConfig())
    return transformers.GPT2LMHeadModel(transformers.GPT2Config())


def build(name: RealModel, seed: int = 0) -> nn.Module:
    """The full-size model, initialised from `seed` (the same on every rank).

    Args:
        name: which architecture.
        seed: torch's seed before the model is made.

    Returns:
        The model, in training mode.

    Raises:
        ImportError: BERT or GPT-2 without `transformers`.
    """
    torch.manual_seed(seed)
    if name is RealModel.RESNET50:
        return vision.resnet50(CLASSES)
    if name is RealModel.VGG16:
        return vision.vgg16(CLASSES)
    return _LanguageModel(_language_model(name))


def vocabulary(name: RealModel) -> int:
    return 30522 if name is RealModel.BERT else 50257


def batch(name: RealModel, batch_size: int, step: int, rank: int,
          inputs: Inputs = Inputs.REDUCED) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets (Note [Full gradients, reduced inputs])."""
    gen = torch.Generator().manual_seed(10_000 * rank + step)
    if name in (RealModel.RESNET50, RealModel.VGG16):
        side = IMAGE_SIDE[inputs][name.value]
        return (torch.randn(batch_size, 3, side, side, generator=gen),
                torch.randint(0, CLASSES, (batch_size,), generator=gen))
    length = SEQUENCE[inputs][name.value]
    tokens = torch.randint(0, vocabulary(name), (batch_size, length + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(name: RealModel, output: Any, target: torch.Tensor) -> torch.Tensor:
    if name in (RealModel.BERT, RealModel.GPT2):
        return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())
    return nn.functional.cross_entropy(output, target)
