"""The real architectures of the benchmark and the examples: full-size gradients, reduced inputs
(Note [Full gradients, reduced inputs]), and torchvision's layout without torchvision (Note
[torchvision's layout without torchvision])."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from commsched.bench import models, vision
from commsched.bench.real_models import RealModel

# The published sizes: torchvision's resnet50 and vgg16, transformers' GPT-2 124M (its head tied
# to the token embedding) and BERT-base with its masked-LM head.
PARAMETERS = {RealModel.RESNET50: 25_557_032, RealModel.VGG16: 138_357_544,
              RealModel.GPT2: 124_439_808, RealModel.BERT: 109_514_298}


def _leaves(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(m).__name__) for name, m in model.named_modules() if not list(m.children())]


@pytest.mark.parametrize("name", ["resnet50", "vgg16"])
def test_vision_layout_is_torchvisions(name: str) -> None:
    builder = vision.torchvision_model(name)
    if builder is None:
        pytest.skip("torchvision cannot be imported beside this torch (setup.sh installs none: "
                    "PyPI's x86_64 wheels are CUDA builds); this check runs wherever it imports")
    ours_cls = {"resnet50": vision._ResNet50, "vgg16": vision._VGG16}[name]
    torch.manual_seed(0)
    theirs = builder(num_classes=1000)
    torch.manual_seed(0)
    ours = ours_cls(1000)
    assert _leaves(theirs) == _leaves(ours)
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    # The same initialisation, draw for draw.
    assert all(torch.equal(a[key], b[key]) for key in a)
    theirs.eval()
    ours.eval()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(RealModel))
def test_real_model_has_its_full_size_and_trains_on_reduced_inputs(name: RealModel) -> None:
    if name in (RealModel.BERT, RealModel.GPT2):
        pytest.importorskip("transformers", reason="setup.sh installs the examples extra")
    model = models.build(models.model_name(name.value))
    params = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in params) == PARAMETERS[name]
    x, y = models.batch(name, 1, step=3, rank=1)
    if name in (RealModel.BERT, RealModel.GPT2):  # a backward of 110-124 M parameters: seconds
        with torch.no_grad():
            assert models.loss_fn(name, model(x), y).isfinite()
        return
    models.loss_fn(name, model(x), y).backward()
    assert all(p.grad is not None for p in params), [
        n for n, p in model.named_parameters() if p.grad is None]
