"""torchvision's ResNet-18, ResNet-50 or MobileNetV2 (random weights) on
synthetic CIFAR-size data (3x32x32 images, 10 classes), data-parallel with
autobyte or torch DDP.

    autobyte launch --workers 3 --servers 3 --bandwidth 1Gbps -- \\
        /usr/bin/python3 examples/torch_resnet.py --backend autobyte --iterations 30
    autobyte launch --workers 3 --arch allreduce --bandwidth 1Gbps -- \\
        /usr/bin/python3 examples/torch_resnet.py --backend ddp --model resnet50 --iterations 30

Prints one JSON line (rank 0): backend, model, iteration_time_s
(steady-state mean), final_loss, ...
"""

import torch
import torch.nn as nn
import torchvision

import torch_common

# torchvision's constructors, by --model. All downsample by 32 and then
# pool, so an image of 32x32 reaches the classifier as 1x1.
MODELS = {
    "resnet18": torchvision.models.resnet18,    # 11.2M parameters with 10 classes
    "resnet50": torchvision.models.resnet50,    # 23.5M
    "mobilenet_v2": torchvision.models.mobilenet_v2,  # 2.2M
}


def build(name, classes, dropout=0.0):
    if name == "mobilenet_v2":  # the only one with dropout (before its classifier)
        return MODELS[name](num_classes=classes, dropout=dropout)
    return MODELS[name](num_classes=classes)


def resnet18(classes):
    return build("resnet18", classes)


def profile_model(batch=32, image=32, classes=10, model="resnet18"):
    """For python -m autobyte.profile examples/torch_resnet.py:profile_model."""
    net = build(model, classes)
    x, y = torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,))
    return net, x, lambda out: nn.functional.cross_entropy(out, y)


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    p.add_argument("--image", type=int, default=32, help="image height and width")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="mobilenet_v2's dropout (its own default is 0.2; 0 keeps runs of different backends comparable)")
    torch_common.image_label_flags(p)
    args = p.parse_args()
    torch_common.check(args)
    if args.image < 8:
        p.error("--image must be >= 8 (the models downsample by 32 then pool), got %d" % args.image)
    if args.classes < 2:
        p.error("--classes must be >= 2, got %d" % args.classes)
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be in [0, 1), got %g" % args.dropout)
    if args.lr is None and args.optimizer == "sgd" and args.model == "resnet50":
        # SGD at the examples' 0.01 with momentum 0.9 diverges on ResNet-50
        # (losses 5-12 within 15 steps of batch 32); 0.001 trains.
        args.lr = 0.001
    torch.manual_seed(args.seed)
    model = build(args.model, args.classes, args.dropout)
    batch = torch_common.image_batches(args, 3, args.image, args.classes)
    torch_common.train(args, model, batch, nn.functional.cross_entropy, extra={"model": args.model})


if __name__ == "__main__":
    main()
