"""A user's own architecture for the benchmarks: any `transformers` configuration by its model
type, or any torchvision model by its builder's name, with overrides, built with random weights
(nothing downloaded) and stepped on synthetic inputs as the real models are (Note [Full
gradients, reduced inputs] in real_models.py).

    hf:gpt2?n_layer=4&n_embd=256          a decoder (its LM head tied, as the config says)
    hf:llama?num_hidden_layers=4          a decoder with an untied head
    hf:t5?num_layers=4&d_model=512        an encoder-decoder (decoder inputs: the tokens)
    hf:vit?num_hidden_layers=6            a vision transformer (image classification)
    tv:mobilenet_v3_small?num_classes=10  a torchvision model
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import urllib.parse
from typing import Any

import torch
from torch import nn

from . import vision
from .real_models import CLASSES, IMAGE_SIDE, SEQUENCE, Inputs, import_transformers

HF_PREFIX, TV_PREFIX = "hf:", "tv:"
REDUCED_SEQUENCE = SEQUENCE[Inputs.REDUCED]["gpt2"]  # tokens per sample, as the real LMs'
REDUCED_IMAGE_SIDE = IMAGE_SIDE[Inputs.REDUCED]["resnet50"]  # a torchvision model's, as ResNet-50's


class Head(enum.StrEnum):
    """What the built model predicts, which sets its inputs and its loss."""

    CAUSAL_LM = "causal-lm"  # next token
    MASKED_LM = "masked-lm"  # each token (an encoder)
    SEQ2SEQ_LM = "seq2seq-lm"  # the decoder's next token
    IMAGE_CLASSES = "image-classes"  # one class per image


def _value(text: str) -> Any:
    """An override's value: an int, a float, a bool or else the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model named as ``hf:<model type>?key=value&...`` or ``tv:<builder>?key=value&...``."""

    value: str  # the text it was parsed from, as reports name the model
    source: str  # HF_PREFIX or TV_PREFIX
    name: str  # the transformers model type or the torchvision builder
    overrides: tuple[tuple[str, Any], ...]  # in the order given

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Reads a spec.

        Args:
            text: ``hf:...`` or ``tv:...``, overrides after ``?`` joined by ``&``.

        Returns:
            The spec.

        Raises:
            ValueError: neither prefix, no name, or an override that is not ``key=value``.
        """
        source = next((p for p in (HF_PREFIX, TV_PREFIX) if text.startswith(p)), None)
        if source is None:
            raise ValueError(f"model {text!r}: expected {HF_PREFIX}<transformers model type> or "
                             f"{TV_PREFIX}<torchvision model>, e.g. hf:t5?num_layers=4")
        name, _, query = text[len(source):].partition("?")
        if not name:
            raise ValueError(f"model {text!r}: no model after {source!r}")
        overrides = []
        for item in filter(None, query.split("&")):
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"model {text!r}: override {item!r} is not key=value")
            overrides.append((key, _value(urllib.parse.unquote(raw))))
        return cls(text, source, name, tuple(overrides))

    def config(self) -> Any:
        """The `transformers` configuration of an ``hf:`` spec, with its overrides (made once:
        `batch` asks for it at every step).

        Raises:
            ImportError: `transformers` is not installed.
            ValueError: an unknown model type, or an override the configuration has no field
                for.
        """
        return _config(self)

    @property
    def head(self) -> Head:
        """What the model predicts (by the configuration's kind, for ``hf:``)."""
        return _head(self)


@functools.cache
def _config(spec: ModelSpec) -> Any:
    transformers = import_transformers(f"model {spec.value!r}")
    try:
        default = transformers.AutoConfig.for_model(spec.name)
    except ValueError:  # its text lists every model type: too long for a command line's error
        raise ValueError(f"model {spec.value!r}: {spec.name!r} is no model type of "
                         f"transformers {transformers.__version__} "
                         "(transformers.AutoConfig.for_model)") from None
    unknown = [key for key, _ in spec.overrides if not hasattr(default, key)]
    if unknown:  # the configuration would keep them as inert attributes
        raise ValueError(f"model {spec.value!r}: {type(default).__name__} has no field "
                         f"{', '.join(map(repr, unknown))}")
    # Passed to the constructor, not set afterwards: fields derived from others at construction
    # (T5's num_decoder_layers from num_layers) follow them.
    return transformers.AutoConfig.for_model(spec.name, **dict(spec.overrides))


@functools.cache
def _head(spec: ModelSpec) -> Head:
    if spec.source == TV_PREFIX:
        return Head.IMAGE_CLASSES
    config = spec.config()
    if config.is_encoder_decoder:
        return Head.SEQ2SEQ_LM
    if getattr(config, "image_size", None) is not None and \
            getattr(config, "vocab_size", None) is None:
        return Head.IMAGE_CLASSES
    transformers = import_transformers(f"model {spec.value!r}")
    # An encoder (BERT) has a causal-LM class too, made for use as a decoder: its masked LM is
    # what it trains as.
    if type(config) in transformers.MODEL_FOR_MASKED_LM_MAPPING:
        return Head.MASKED_LM
    return Head.CAUSAL_LM


class _HuggingFaceModel(nn.Module):
    """A `transformers` model whose forward takes the synthetic input and returns logits. Held
    as `model`, so its parameter names are prefixed ``model.``."""

    def __init__(self, model: nn.Module, head: Head) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.head is Head.IMAGE_CLASSES:
            logits: torch.Tensor = self.model(pixel_values=inputs).logits
        elif self.head is Head.SEQ2SEQ_LM:  # teacher forcing on the same tokens
            logits = self.model(input_ids=inputs, decoder_input_ids=inputs).logits
        else:
            logits = self.model(input_ids=inputs).logits
        return logits


def build(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """The model of `spec`, initialised from `seed` (the same on every rank).

    Args:
        spec: which model.
        seed: torch's seed before the model is made.

    Returns:
        The model, in training mode.

    Raises:
        ImportError: `transformers` (``hf:``) or torchvision (``tv:``) cannot be imported.
        ValueError: the spec names no model, or a field the model does not take.
    """
    torch.manual_seed(seed)
    if spec.source == TV_PREFIX:
        builder = vision.torchvision_model(spec.name)
        if builder is None:
            raise ImportError(f"model {spec.value!r} is built by torchvision, which cannot be "
                              "imported beside this torch: install the torchvision release "
                              "made for it")
        return builder(weights=None, **dict(spec.overrides)).train()
    transformers = import_transformers(f"model {spec.value!r}")
    mapping = {Head.CAUSAL_LM: transformers.AutoModelForCausalLM,
               Head.MASKED_LM: transformers.AutoModelForMaskedLM,
               Head.SEQ2SEQ_LM: transformers.AutoModelForSeq2SeqLM,
               Head.IMAGE_CLASSES: transformers.AutoModelForImageClassification}
    head = spec.head
    try:
        model = mapping[head].from_config(spec.config())
    except ValueError as err:
        raise ValueError(f"model {spec.value!r}: transformers builds no {head.value} model of "
                         f"it ({err})") from None
    return _HuggingFaceModel(model, head).train()


def _classes(spec: ModelSpec) -> int:
    if spec.source == TV_PREFIX:
        return int(dict(spec.overrides).get("num_classes", CLASSES))  # torchvision's default
    return int(spec.config().num_labels)


def batch(spec: ModelSpec, batch_size: int, step: int,
          rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets of `spec`'s model, drawn from (rank, step)."""
    gen = torch.Generator().manual_seed(10_000 * rank + step)
    head = spec.head
    if head is Head.IMAGE_CLASSES:
        if spec.source == TV_PREFIX:
            channels, side = 3, REDUCED_IMAGE_SIDE
        else:
            config = spec.config()
            channels, side = config.num_channels, config.image_size
        return (torch.randn(batch_size, channels, side, side, generator=gen),
                torch.randint(0, _classes(spec), (batch_size,), generator=gen))
    config = spec.config()
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions",
                                                                         None)
    length = min(REDUCED_SEQUENCE, limit - 1) if limit else REDUCED_SEQUENCE
    tokens = torch.randint(0, config.vocab_size, (batch_size, length + 1), generator=gen)
    if head is Head.CAUSAL_LM:
        return tokens[:, :-1], tokens[:, 1:]
    return tokens[:, :-1], tokens[:, :-1]  # each position predicts its own token


def loss_fn(spec: ModelSpec, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits against the targets `batch` drew."""
    if spec.head is Head.IMAGE_CLASSES:
        return nn.functional.cross_entropy(output, target)
    return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())
