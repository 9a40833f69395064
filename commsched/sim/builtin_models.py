"""Generates the built-in profiles (ResNet-50, VGG-16, BERT-base) from the architectures.

Parameter shapes and names follow torchvision's resnet50 / vgg16 and Hugging Face's
BertForPreTraining (bert-base-uncased), so the tensor list is what the profiler would record for
those models. Times are derived, not measured, from these stated assumptions:

* GPU: NVIDIA V100-SXM2, mixed precision, 125 TFLOPS fp16 tensor-core peak, of which 25% is
  achieved on the model's convolutions and matrix products (31.25 TFLOPS: about the 1,250
  images/s that ResNet-50 trains at on one V100 with AMP);
* only convolutions, linear layers and attention matrix products are counted, at 2 FLOPs per
  multiply-add; normalisation, activations, pooling, embedding look-ups and softmax are
  memory-bound and folded into the 25%;
* backward costs twice the forward (input and weight gradients), layer by layer in reverse
  forward order, and a layer's parameter gradients are ready when its backward ends;
* batch per GPU: ResNet-50 64 images and VGG-16 32 images at 224x224, BERT-base 32 sequences of
  128 tokens (pre-training: masked-LM head over every token, next-sentence head);
* the optimizer's update is element-wise and moves 32 bytes per parameter (parameter, gradient,
  two state tensors, read and written) at the V100's 900 GB/s;
* gradients are float32 (mixed-precision training keeps fp32 master parameters);
* data loading and the loss are free (before_first_ready_s = forward + the backward of the
  last layer with parameters).

Run ``python -m commsched.sim.builtin_models`` to rewrite commsched/sim/builtin/*.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PEAK_FLOPS = 125e12
EFFICIENCY = 0.25
EFFECTIVE_FLOPS = PEAK_FLOPS * EFFICIENCY
MEMORY_BYTES_PER_S = 900e9
UPDATE_BYTES_PER_PARAM = 32
BACKWARD_FACTOR = 2.0


@dataclass
class Layer:
    """A module in forward order: its parameters (name, numel) and forward FLOPs per sample."""

    module: str
    params: list[tuple[str, int]] = field(default_factory=list)
    flops: float = 0.0
    first_user: str | None = None  # when an earlier module's pre-hook applies the parameters


@dataclass
class Model:
    name: str
    batch: int
    description: str
    layers: list[Layer]
    declared: list[str] | None = None  # parameter declaration order, when not the forward order

    def params(self) -> Iterator[tuple[Layer, str, int]]:
        for layer in self.layers:
            for name, numel in layer.params:
                yield layer, name, numel


def conv(module: str, cin: int, cout: int, k: int, out_hw: int, bias: bool = False) -> Layer:
    params = [(f"{module}.weight", cout * cin * k * k)]
    if bias:
        params.append((f"{module}.bias", cout))
    return Layer(module, params, 2.0 * cin * k * k * cout * out_hw * out_hw)


def norm(module: str, channels: int) -> Layer:
    return Layer(module, [(f"{module}.weight", channels), (f"{module}.bias", channels)])


def linear(module: str, fin: int, fout: int, tokens: int = 1, bias: bool = True) -> Layer:
    params = [(f"{module}.weight", fout * fin)] + ([(f"{module}.bias", fout)] if bias else [])
    return Layer(module, params, 2.0 * fin * fout * tokens)


def resnet50() -> Model:
    layers = [conv("conv1", 3, 64, 7, 112), norm("bn1", 64)]
    cin, hw = 64, 56
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                      (512, 3, 2)], start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            s = stride if b == 0 else 1
            out_hw = hw // s
            layers += [conv(f"{p}.conv1", cin, width, 1, hw), norm(f"{p}.bn1", width),
                       conv(f"{p}.conv2", width, width, 3, out_hw), norm(f"{p}.bn2", width),
                       conv(f"{p}.conv3", width, 4 * width, 1, out_hw), norm(f"{p}.bn3", 4 * width)]
            if b == 0:
                layers += [conv(f"{p}.downsample.0", cin, 4 * width, 1, out_hw),
                           norm(f"{p}.downsample.1", 4 * width)]
            cin, hw = 4 * width, out_hw
    layers.append(linear("fc", 2048, 1000))
    return Model("resnet50", 64, "torchvision resnet50, 224x224 images, 64 per GPU", layers)


def vgg16() -> Model:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    layers, cin, hw, index = [], 3, 224, 0
    for item in cfg:
        if item == "M":
            hw //= 2
            index += 1
            continue
        assert isinstance(item, int)
        layers.append(conv(f"features.{index}", cin, item, 3, hw, bias=True))
        cin, index = item, index + 2  # conv, ReLU
    layers += [linear("classifier.0", 512 * 7 * 7, 4096), linear("classifier.3", 4096, 4096),
               linear("classifier.6", 4096, 1000)]
    return Model("vgg16", 32, "torchvision vgg16, 224x224 images, 32 per GPU", layers)


def bert_base(seq: int = 128) -> Model:
    d, ff, vocab, heads_layers = 768, 3072, 30522, 12
    e = "bert.embeddings"
    layers = [Layer(f"{e}.word_embeddings", [(f"{e}.word_embeddings.weight", vocab * d)]),
              Layer(f"{e}.position_embeddings", [(f"{e}.position_embeddings.weight", 512 * d)]),
              Layer(f"{e}.token_type_embeddings", [(f"{e}.token_type_embeddings.weight", 2 * d)]),
              norm(f"{e}.LayerNorm", d)]
    for i in range(heads_layers):
        p = f"bert.encoder.layer.{i}"
        # Q K^T and the attention-weighted sum of V: 2 * seq * seq * d multiply-adds.
        layers += [Layer(f"{p}.attention.self", flops=4.0 * seq * seq * d),
                   linear(f"{p}.attention.self.query", d, d, seq),
                   linear(f"{p}.attention.self.key", d, d, seq),
                   linear(f"{p}.attention.self.value", d, d, seq),
                   linear(f"{p}.attention.output.dense", d, d, seq),
                   norm(f"{p}.attention.output.LayerNorm", d),
                   linear(f"{p}.intermediate.dense", d, ff, seq),
                   linear(f"{p}.output.dense", ff, d, seq),
                   norm(f"{p}.output.LayerNorm", d)]
    layers += [linear("bert.pooler.dense", d, d),  # the [CLS] token only
               Layer("cls.predictions"),
               linear("cls.predictions.transform.dense", d, d, seq),
               norm("cls.predictions.transform.LayerNorm", d),
               # The decoder's weight is tied to the word embeddings (one tensor, first used by
               # the embeddings); its bias is cls.predictions.bias, applied by cls.predictions.
               Layer("cls.predictions.decoder", [("cls.predictions.bias", vocab)],
                     2.0 * d * vocab * seq, first_user="cls.predictions"),
               linear("cls.seq_relationship", d, 2)]
    declared = [name for layer in layers for name, _ in layer.params]
    declared.remove("cls.predictions.bias")
    declared.insert(declared.index("cls.predictions.transform.dense.weight"),
                    "cls.predictions.bias")
    return Model("bert-base", 32, f"BertForPreTraining (bert-base-uncased), {seq}-token "
                 "sequences, 32 per GPU", layers, declared)


MODELS = {"resnet50": resnet50, "vgg16": vgg16, "bert-base": bert_base}


def forward_flops(model: Model) -> float:
    return sum(layer.flops for layer in model.layers)


def document(model: Model) -> dict:
    """The model's profile document (schema 2)."""
    seconds = [layer.flops * model.batch / EFFECTIVE_FLOPS for layer in model.layers]
    # Backward runs the layers in reverse; done[i] = when layer i's backward ends, counted from
    # the start of backward.
    done, clock = [0.0] * len(seconds), 0.0
    for i in reversed(range(len(seconds))):
        clock += BACKWARD_FACTOR * seconds[i]
        done[i] = clock
    with_params = [i for i, layer in enumerate(model.layers) if layer.params]
    first_ready = min(done[i] for i in with_params)
    order = model.declared or [name for _, name, _ in model.params()]
    index = {name: i for i, name in enumerate(order)}
    tensors: list[dict] = []
    position = {id(layer): i for i, layer in enumerate(model.layers)}
    for layer, name, numel in sorted(model.params(), key=lambda row: index[row[1]]):
        tensors.append({"id": len(tensors), "name": name, "numel": numel, "dtype": "float32",
                        "bytes": 4 * numel, "forward_index": index[name],
                        "ready_time_s": round(done[position[id(layer)]] - first_ready, 9),
                        "module": layer.first_user or layer.module})
    forward = sum(seconds)
    modules = [{"name": "", "forward_order": 0, "forward_time_s": round(forward, 9),
                "self_time_s": 0.0}]
    modules += [{"name": layer.module, "forward_order": i + 1,
                 "forward_time_s": round(s, 9), "self_time_s": round(s, 9)}
                for i, (layer, s) in enumerate(zip(model.layers, seconds, strict=True))]
    numel = sum(n for _, _, n in model.params())
    return {
        "schema_version": 2,
        "world_size": 1,
        "iterations": 0,
        "compute": {"before_first_ready_s": round(forward + first_ready, 9),
                    "step_s": round(numel * UPDATE_BYTES_PER_PARAM / MEMORY_BYTES_PER_S, 9)},
        "tensors": tensors,
        "modules": modules,
        "generated": {
            "by": "commsched.sim.builtin_models (derived from the architecture, not measured)",
            "model": model.description,
            "parameters": numel,
            "forward_gflops_per_sample": round(forward_flops(model) / 1e9, 3),
            "gpu": f"NVIDIA V100-SXM2, {EFFICIENCY:.0%} of {PEAK_FLOPS / 1e12:.0f} TFLOPS fp16 "
                   f"peak = {EFFECTIVE_FLOPS / 1e12:.2f} TFLOPS; backward = "
                   f"{BACKWARD_FACTOR:g}x forward; update {UPDATE_BYTES_PER_PARAM} B/parameter "
                   f"at {MEMORY_BYTES_PER_S / 1e9:.0f} GB/s",
        },
    }


def write_all(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in MODELS.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(document(build()), indent=1) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_all(Path(__file__).resolve().parent / "builtin"):
        print(written)
