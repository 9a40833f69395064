"""What the BERT and GPT-2 examples share: their size options, AdamW and the token batches."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import device, parser, train
from torch import nn

import commsched

try:
    import transformers
except ImportError as err:  # an extra, as Horovod's examples need torchvision
    raise SystemExit("this example builds its model with `transformers`: "
                     "pip install 'transformers>=4.40' (or, in commsched's checkout, "
                     "pip install --no-build-isolation '.[examples]')") from err


def size_options(description: str) -> argparse.ArgumentParser:
    """The common options, and the model's size (default: the base model's own)."""
    p = parser(description)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size (0: the model's own)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute each layer's activations in backward instead of keeping them "
                        "(less memory, more compute; every policy supports it)")
    return p


def run(args: argparse.Namespace, make_model: Callable[[], nn.Module], vocab: int,
        make_batch: Callable[[torch.Tensor], dict[str, Any]]) -> None:
    """Trains `make_model()` with AdamW on random token sequences of `args.seq_len` drawn from
    `vocab` ids; `make_batch(tokens)` turns them into the model's keyword arguments, labels
    included."""
    if args.threads:
        torch.set_num_threads(args.threads)
    commsched.init()
    where = device()
    torch.manual_seed(0)  # random weights from the configuration: nothing is downloaded
    model = make_model().to(where)
    if args.gradient_checkpointing:
        assert isinstance(model, transformers.PreTrainedModel)
        # Non-reentrant, as torch recommends: the reentrant kind needs an input that requires
        # grad. transformers 5 renamed the method.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False  # no key/value cache in training: it cannot be recomputed
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr or 1e-4, weight_decay=0.01)

    def batch(step: int, rank: int, where: torch.device) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(1_000_003 * rank + step)
        tokens = torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=gen)
        return {k: v.to(where) for k, v in make_batch(tokens).items()}

    def compute_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = model(**batch).loss
        return loss

    train(args, model, optimizer, batch, compute_loss, where)


__all__ = ["run", "size_options", "transformers"]
