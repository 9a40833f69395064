"""GPT-2 (124M) causal-language-model training on random tokens, with commsched, under
horovodrun or torchrun. The model is built from `transformers`' GPT2Config: random weights,
nothing downloaded.

    horovodrun -np 2 python examples/pytorch_gpt2.py --policy auto --amp
    torchrun --nproc_per_node=2 examples/pytorch_gpt2.py --checkpoint gpt2.pt
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_common import run, size_options, transformers


def main() -> None:
    args = size_options(__doc__).parse_args()
    config = transformers.GPT2Config(
        n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
        n_positions=max(1024, args.seq_len),
        # A smaller vocabulary moves the end-of-text token, GPT-2's bos and eos, to its end.
        **({"vocab_size": args.vocab, "bos_token_id": args.vocab - 1,
            "eos_token_id": args.vocab - 1} if args.vocab else {}))

    def make_batch(tokens: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": tokens, "labels": tokens}  # the model shifts labels itself

    run(args, lambda: transformers.GPT2LMHeadModel(config), config.vocab_size, make_batch)


if __name__ == "__main__":
    main()
