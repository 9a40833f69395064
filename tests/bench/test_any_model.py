"""commsched/bench/any_model.py: a user's own architecture by a transformers model type or a
torchvision builder, with overrides, as `compare --model` takes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from commsched.bench import any_model, models
from commsched.bench.any_model import Head, ModelSpec
from commsched.bench.vision import torchvision_model

pytest.importorskip("transformers")

SMALL = "num_hidden_layers=2&hidden_size=32&intermediate_size=64&num_attention_heads=2"
# One of each kind the zoo needs, each small enough to step here in a moment.
KINDS = {
    "hf:gpt2?n_layer=2&n_embd=32&n_head=2&vocab_size=300": Head.CAUSAL_LM,  # tied head
    f"hf:llama?{SMALL}&num_key_value_heads=2&vocab_size=300": Head.CAUSAL_LM,  # untied
    f"hf:mixtral?{SMALL}&num_key_value_heads=2&num_local_experts=4&vocab_size=300":
        Head.CAUSAL_LM,  # mixture of experts
    f"hf:bert?{SMALL}&vocab_size=300": Head.MASKED_LM,
    "hf:t5?num_layers=2&d_model=32&d_ff=64&num_heads=2&d_kv=16&vocab_size=300": Head.SEQ2SEQ_LM,
    f"hf:vit?{SMALL}&image_size=32&patch_size=8": Head.IMAGE_CLASSES,
}


def test_a_spec_reads_its_overrides_as_values() -> None:
    spec = ModelSpec.parse("hf:t5?num_layers=4&d_model=512&dropout_rate=0.0&use_cache=false"
                           "&feed_forward_proj=gated-gelu")
    assert (spec.source, spec.name) == ("hf:", "t5")
    assert dict(spec.overrides) == {"num_layers": 4, "d_model": 512, "dropout_rate": 0.0,
                                    "use_cache": False, "feed_forward_proj": "gated-gelu"}
    config = spec.config()
    # Passed at construction: the decoder's depth follows the encoder's, as T5Config derives it.
    assert (config.num_layers, config.num_decoder_layers, config.d_model) == (4, 4, 512)
    assert models.model_name("hf:t5?num_layers=4") == ModelSpec.parse("hf:t5?num_layers=4")
    assert models.model_name("gpt2") is models.RealModel.GPT2


@pytest.mark.parametrize("text,message", [
    ("hf:", "no model after 'hf:'"),
    ("hf:gpt2?n_layer", "override 'n_layer' is not key=value"),
    ("hf:gpt2?n_layerz=2", "GPT2Config has no field 'n_layerz'"),
    ("hf:no_such_model", "'no_such_model' is no model type of transformers"),
    ("gpt3", "choose from cnn, transformer, mlp, resnet50, vgg16, bert, gpt2, or name your own"),
])
def test_a_bad_model_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="model '") as caught:
        spec = models.model_name(text)
        assert isinstance(spec, ModelSpec)
        spec.config()
    assert message in str(caught.value)


@pytest.mark.parametrize("text", list(KINDS))
def test_each_kind_builds_and_steps_on_its_own_inputs(text: str) -> None:
    spec = ModelSpec.parse(text)
    assert spec.head is KINDS[text]
    model = models.build(spec, seed=3)
    again = models.build(spec, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(),
                                                 strict=True)), "not the same on every rank"
    x, y = models.batch(spec, 2, step=1, rank=0)
    assert torch.equal(x, models.batch(spec, 2, step=1, rank=0)[0])
    assert not torch.equal(x, models.batch(spec, 2, step=1, rank=1)[0])
    loss = models.loss_fn(spec, model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    if spec.name == "gpt2":  # the head shares the embedding's weight: one parameter
        names = [n for n, _ in model.named_parameters()]
        assert "model.transformer.wte.weight" in names and "model.lm_head.weight" not in names


def test_a_torchvision_model_is_built_or_its_absence_named() -> None:
    spec = ModelSpec.parse("tv:mobilenet_v3_small?num_classes=10")
    if torchvision_model("mobilenet_v3_small") is None:
        with pytest.raises(ImportError, match="built by torchvision, which cannot be imported"):
            any_model.build(spec)
        return
    model = any_model.build(spec)
    x, y = any_model.batch(spec, 2, 0, 0)
    assert x.shape == (2, 3, 64, 64) and int(y.max()) < 10
    any_model.loss_fn(spec, model(x), y).backward()


def test_compare_times_a_transformers_config_given_on_the_command_line(tmp_path) -> None:
    """`compare --model hf:...` in a world of one, end to end: the report names the model."""
    spec = "hf:llama?" + SMALL + "&num_key_value_heads=2&vocab_size=300"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMSCHED_")}
    out = subprocess.run(
        [sys.executable, "-m", "commsched.bench.compare", "--model", spec, "--batch-size", "2",
         "--candidates", "commsched:horovod", "--warmup", "2", "--rounds", "1", "--steps", "2",
         "--out", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["meta"]["model"] == spec, results["meta"]
    bad = subprocess.run([sys.executable, "-m", "commsched.bench.compare", "--model",
                          "hf:llama?num_hidden_layerz=2"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and "LlamaConfig has no field 'num_hidden_layerz'" in bad.stderr, \
        bad.stderr
