"""BERT-base masked-language-model pre-training on random tokens, with commsched, under
horovodrun or torchrun. The model is built from `transformers`' BertConfig: random weights,
nothing downloaded.

    horovodrun -np 2 python examples/pytorch_bert.py --policy dear --amp bf16
    torchrun --nproc_per_node=2 examples/pytorch_bert.py --checkpoint bert.pt
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_common import run, size_options, transformers

MASKED = 0.15  # BERT's share of masked positions
MASK_ID = 103  # [MASK] in BERT's vocabulary


def main() -> None:
    args = size_options(__doc__).parse_args()
    config = transformers.BertConfig(
        hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden, max_position_embeddings=max(512, args.seq_len),
        **({"vocab_size": args.vocab} if args.vocab else {}))

    def make_batch(tokens: torch.Tensor) -> dict[str, Any]:
        masked = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(
            int(tokens[0, 0]))) < MASKED
        labels = torch.where(masked, tokens, torch.full_like(tokens, -100))  # -100: no loss
        mask_id = min(MASK_ID, config.vocab_size - 1)
        inputs = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
        return {"input_ids": inputs, "labels": labels}

    run(args, lambda: transformers.BertForMaskedLM(config), config.vocab_size, make_batch)


if __name__ == "__main__":
    main()
