"""ResNet-50 and VGG-16 as torchvision builds them, for where torchvision cannot be imported.

Note [torchvision's layout without torchvision]
The benchmark and the examples judge a schedule on ResNet-50 and VGG-16. What a schedule sees of
a model is its parameters: their names, shapes and order, and the modules that hold them. Where
torchvision imports, `resnet50()` and `vgg16()` return torchvision's own models. Where it does
not (PyPI's x86_64 torchvision wheels are CUDA builds, and one fails to import beside a CPU
torch: "operator torchvision::nms does not exist"), they build the same architecture here, with
torchvision's module names, parameter shapes, registration order and initialisation (ResNet
v1.5, the stride on the 3x3 convolution; VGG configuration "D" without batch norm). A state_dict
of one loads into the other; tests/bench/test_real_models.py checks that against torchvision
wherever torchvision imports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

_VGG16_FEATURES = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                   512, 512, 512, "M")


@functools.cache
def torchvision_model(name: str) -> Callable[..., nn.Module] | None:
    """torchvision's builder `name` (e.g. "resnet50"), or None where torchvision cannot be
    imported beside this torch (asked once: a failing import is slow to repeat)."""
    try:
        from torchvision import models
    except (ImportError, RuntimeError):  # absent, or built for another torch
        return None
    builder: Callable[..., nn.Module] = getattr(models, name)
    return builder


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


def _stage(inplanes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    """One of ResNet's four stages: the first block changes the width and the stride."""
    first = _Bottleneck(inplanes, planes, stride)
    rest = [_Bottleneck(planes * _Bottleneck.expansion, planes, 1) for _ in range(blocks - 1)]
    return nn.Sequential(first, *rest)


class _ResNet50(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = _stage(64, 64, 3, 1)
        self.layer2 = _stage(256, 128, 4, 2)
        self.layer3 = _stage(512, 256, 6, 2)
        self.layer4 = _stage(1024, 512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class _VGG16(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for width in _VGG16_FEATURES:
            if width == "M":
                layers.append(nn.MaxPool2d(2, stride=2))
            else:
                assert isinstance(width, int)
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
                channels = width
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(4096, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)  # type: ignore[arg-type]  # bias=True above
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 (25.6 M parameters): torchvision's where it imports, else the same layout
    (Note [torchvision's layout without torchvision]).

    Args:
        num_classes: outputs of the final fully connected layer.

    Returns:
        The model, randomly initialised as torchvision initialises it.
    """
    return _build("resnet50", _ResNet50, num_classes)


def vgg16(num_classes: int = 1000) -> nn.Module:
    """VGG-16 (138 M parameters, configuration "D" without batch norm): torchvision's where it
    imports, else the same layout (Note [torchvision's layout without torchvision]).

    Args:
        num_classes: outputs of the final fully connected layer.

    Returns:
        The model, randomly initialised as torchvision initialises it.
    """
    return _build("vgg16", _VGG16, num_classes)


def _build(name: str, ours: Callable[[int], nn.Module], num_classes: int) -> nn.Module:
    builder = torchvision_model(name)
    return builder(num_classes=num_classes) if builder else ours(num_classes)
