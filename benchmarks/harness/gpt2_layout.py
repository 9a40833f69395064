"""GPT-2 124M's parameter layout at a width that leaves almost only the host's work: a stand-in,
on a CPU, for a GPU step that the host's Python and kernel launches bound (Note [A host-bound
step on a CPU]).

Note [A host-bound step on a CPU]
On the lent H100, GPT-2 124M at batch 8 x 512 is bound by the host: its step takes about as long
as the host needs to launch it, so a microsecond commsched adds on the host is a microsecond of
the step. What commsched adds on the host grows with the tensors it hooks and the optimizer
calls it makes, not with their size. So this model has GPT-2's 148 parameter tensors in GPT-2's
order and parameter-holding modules (token and position embeddings, twelve blocks of layer norm,
attention, layer norm and MLP, a final layer norm, the head tied to the token embedding) at a
width of 32, on one sequence of 64 tokens: a CPU core runs its plain step in about 7.3 ms, most
of it the fixed cost of each operator, as a GPU step's host time is mostly that of each launch.
It has 113 modules where `transformers`' GPT-2 has about 165 (no dropout, activation or wrapper
modules, which hold no parameter). Only the profiled and sampled forward passes hook every
module, so it understates those passes a little, and no other. Its overhead report reads what
commsched adds per GPT-2 step, in milliseconds, without a GPU and without `transformers`. It
cannot show a cost only a device has (a wait for the device, a stream's ordering): the GPU's own
readings stay the ones item 3 is judged by.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

WIDTH, LAYERS, HEADS, VOCAB, POSITIONS = 32, 12, 4, 512, 64


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, HEADS, WIDTH // HEADS).transpose(1, 2)
                   for t in self.c_attn(x).split(WIDTH, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(batch, seq, WIDTH))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.c_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(WIDTH), _Attention()
        self.ln_2, self.mlp = nn.LayerNorm(WIDTH), _Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2Layout(nn.Module):
    """Token ids (batch, seq <= 64) -> the language-model loss of predicting each next token."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(POSITIONS, WIDTH)
        self.h = nn.ModuleList(_Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the head is the token embedding
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_batch(step: int, batch_size: int, device: torch.device) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (batch_size, POSITIONS), generator=gen).to(device)
    return tokens, tokens
