"""A VGG-style CNN on synthetic CIFAR-size data (3x32x32 images, 10 classes),
data-parallel with autobyte or torch DDP.

    autobyte launch --workers 3 --servers 3 --bandwidth 200Mbps -- \\
        /usr/bin/python3 examples/torch_cnn.py --backend autobyte --iterations 30
    autobyte launch --workers 3 --arch allreduce --bandwidth 200Mbps -- \\
        /usr/bin/python3 examples/torch_cnn.py --backend ddp --iterations 30

Prints one JSON line (rank 0): backend, iteration_time_s (steady-state
mean), final_loss, ...
"""

import torch
import torch.nn as nn

import torch_common


def vgg(width, batchnorm):
    layers, c = [], 3
    for out, pool in [(width, False), (width, True), (2 * width, False), (2 * width, True),
                      (4 * width, False), (4 * width, True)]:
        layers.append(nn.Conv2d(c, out, 3, padding=1))
        if batchnorm:
            layers.append(nn.BatchNorm2d(out))
        layers.append(nn.ReLU(inplace=True))
        if pool:
            layers.append(nn.MaxPool2d(2))
        c = out
    layers += [nn.Flatten(), nn.Linear(c * 4 * 4, 8 * width), nn.ReLU(inplace=True), nn.Linear(8 * width, 10)]
    return nn.Sequential(*layers)


def profile_model(width=64, batch=32):
    """For python -m autobyte.profile examples/torch_cnn.py:profile_model."""
    model = vgg(width, True)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    return model, x, lambda out: nn.functional.cross_entropy(out, y)


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=64, help="channels of the first convolutions (64: 3.3M parameters)")
    p.add_argument("--batchnorm", type=int, default=1, help="1: BatchNorm after each convolution")
    torch_common.image_label_flags(p)
    args = p.parse_args()
    torch_common.check(args)
    if args.width < 1:
        p.error("--width must be >= 1, got %d" % args.width)
    torch.manual_seed(args.seed)
    model = vgg(args.width, bool(args.batchnorm))
    torch_common.train(args, model, torch_common.image_batches(args, 3, 32, 10), nn.functional.cross_entropy)


if __name__ == "__main__":
    main()
