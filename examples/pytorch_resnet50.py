"""ResNet-50 on synthetic ImageNet-shaped data, with commsched, under horovodrun or torchrun.

    horovodrun -np 2 python examples/pytorch_resnet50.py --policy auto --amp
    torchrun --nproc_per_node=2 examples/pytorch_resnet50.py --checkpoint resnet50.pt

The model is torchvision's. Where torchvision cannot be imported beside the installed torch,
commsched.bench.vision builds the same layout (docs/examples.md).
"""

from __future__ import annotations

import torch
from common import device, parser, train
from torch import nn

import commsched

try:
    from torchvision.models import resnet50
except (ImportError, RuntimeError):  # absent, or a build for another torch
    from commsched.bench.vision import resnet50


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    commsched.init()
    where = device()
    torch.manual_seed(0)  # the same initial model on every rank (the broadcast makes sure)
    model = resnet50(num_classes=args.classes).to(where)
    # Goyal et al.: the learning rate grows with the global batch (0.1 per 256 samples).
    lr = args.lr or 0.1 * args.batch_size * commsched.size() / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)

    def make_batch(step: int, rank: int, where: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1_000_003 * rank + step)
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen)
        labels = torch.randint(0, args.classes, (args.batch_size,), generator=gen)
        return images.to(where), labels.to(where)

    def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(model(images), labels)

    train(args, model, optimizer, make_batch, compute_loss, where)


if __name__ == "__main__":
    main()
