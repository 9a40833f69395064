"""GPT-2's parameter layout at width 32 (harness/gpt2_layout.py, Note [A host-bound step on a
CPU]): what commsched hooks must be GPT-2 124M's, or the host cost read on it is not GPT-2's."""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness import overhead
from benchmarks.harness.gpt2_layout import LAYERS, Gpt2Layout, make_batch
from benchmarks.harness.overhead_workloads import workload

# GPT-2 124M's (transformers' GPT2Model) parameter names per block, in its order.
BLOCK = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def test_the_tensors_are_gpt2s_in_its_order_with_the_head_tied() -> None:
    model = Gpt2Layout()
    names = [name for name, _ in model.named_parameters()]
    assert names == ["wte.weight", "wpe.weight",
                     *(f"h.{i}.{name}" for i in range(LAYERS) for name in BLOCK),
                     "ln_f.weight", "ln_f.bias"]
    assert len(names) == 148
    tokens, _ = make_batch(0, 1, torch.device("cpu"))
    loss = model(tokens)
    loss.backward()
    assert torch.isfinite(loss) and model.wte.weight.grad is not None
    # The head is the token embedding: every vocabulary row gets a gradient through the head,
    # also the rows of tokens the 64 of the batch do not hold (the lookup reaches only those).
    assert (model.wte.weight.grad.abs().sum(dim=1) > 0).all()
    assert len(set(tokens[0].tolist())) < model.wte.weight.shape[0]


def test_the_benchmark_takes_the_layout_and_refuses_a_model_it_has_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    work = workload("gpt2_layout", torch.device("cpu"))
    assert work is not None and work.name == "gpt2_layout"
    x, y = work.make_batch(3)
    assert x.shape == (1, 64) and torch.equal(x, y)
    with pytest.raises(SystemExit):
        overhead.main(["--models", "gpt2_layout,resnet"])
    assert "--models gpt2_layout,resnet: choose from gpt2, gpt2_layout, cnn" in \
        capsys.readouterr().err
