"""The compute profiles the cluster testbed replays, from a stated model of a GPU: each real
model's FLOPs per module at its full inputs (torch.utils.flop_counter, on the meta device: only
shapes are read), at a named device's sustained rate (commsched.bench.profile_model.GPU_RATES).

    python -m benchmarks.harness.flop_profiles --gpu h100-sxm --out benchmarks/cluster/profiles
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from commsched.bench import real_models
from commsched.bench.profile_model import GPU_RATES, flop_profile
from commsched.bench.real_models import Inputs, RealModel

# Samples per GPU and iteration: what data-parallel training of these models commonly runs.
BATCHES = {RealModel.RESNET50: 256, RealModel.BERT: 64, RealModel.GPT2: 8, RealModel.VGG16: 128}


def write_profile(name: RealModel, gpu: str, out: str) -> str:
    """Writes OUT/<model>.json; returns its path."""
    with torch.device("meta"):  # built there, so that tied weights stay one parameter
        model = real_models.build(name)
    inputs, _ = real_models.batch(name, BATCHES[name], 0, 0, Inputs.FULL)
    profile = flop_profile(model, [inputs.to("meta")], name.value, BATCHES[name], GPU_RATES[gpu])
    path = os.path.join(out, f"{name.value}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(profile.to_json(), handle, indent=1)
    print(f"{name.value}: batch {BATCHES[name]}, {len(profile.modules)} modules, "
          f"{profile.numel / 1e6:.1f} M parameters, forward {profile.forward_s * 1e3:.2f} ms, "
          f"backward {profile.backward_s * 1e3:.2f} ms, update {profile.update_s * 1e3:.2f} ms")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", choices=sorted(GPU_RATES), default="h100-sxm")
    parser.add_argument("--models", default="resnet50,bert,gpt2")
    parser.add_argument("--out", default="benchmarks/cluster/profiles")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        write_profile(RealModel(name), args.gpu, args.out)


if __name__ == "__main__":
    main()
