"""torchvision's ResNet-18 (random weights) on synthetic CIFAR-size data
(3x32x32 images, 10 classes), data-parallel with autobyte or torch DDP.

    autobyte launch --workers 3 --servers 3 --bandwidth 1Gbps -- \\
        /usr/bin/python3 examples/torch_resnet.py --backend autobyte --iterations 30
    autobyte launch --workers 3 --arch allreduce --bandwidth 1Gbps -- \\
        /usr/bin/python3 examples/torch_resnet.py --backend ddp --iterations 30

Prints one JSON line (rank 0): backend, iteration_time_s (steady-state
mean), final_loss, ...
"""

import torch
import torch.nn as nn
import torchvision

import torch_common


def resnet18(classes):
    return torchvision.models.resnet18(num_classes=classes)


def profile_model(batch=32, image=32, classes=10):
    """For python -m autobyte.profile examples/torch_resnet.py:profile_model."""
    model = resnet18(classes)
    x, y = torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,))
    return model, x, lambda out: nn.functional.cross_entropy(out, y)


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    p.add_argument("--image", type=int, default=32, help="image height and width")
    p.add_argument("--classes", type=int, default=10)
    args = p.parse_args()
    torch_common.check(args)
    if args.image < 8:
        p.error("--image must be >= 8 (ResNet downsamples by 32 then pools), got %d" % args.image)
    if args.classes < 2:
        p.error("--classes must be >= 2, got %d" % args.classes)
    torch.manual_seed(args.seed)
    model = resnet18(args.classes)

    def batch(gen):
        x = torch.randn(args.batch, 3, args.image, args.image, generator=gen)
        y = torch.randint(0, args.classes, (args.batch,), generator=gen)
        return x, y

    torch_common.train(args, model, batch, nn.functional.cross_entropy)


if __name__ == "__main__":
    main()
