"""Code that changes or reads the parameters after optimizer.step(): weight
clipping (WGAN's clamp) and an exponential moving average of the weights
(torch.optim.swa_utils.AveragedModel). Under DDP the update is in place when
step() returns; autobyte applies it when the next forward reaches each
layer, so such code calls optimizer.synchronize() first.

    after_step_worker.py --case clamp|ema --out FILE [--backend autobyte|reference] [--world N] [--no-sync]

--backend reference computes the exact run in one process (the batches of
every rank at once); rank 0 of an autobyte run saves its parameters and the
average's to FILE. --no-sync leaves synchronize() out: autobyte must refuse
the clamp then, naming the parameter.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

STEPS = 6
CLAMP = 0.2


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=["clamp", "ema"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["autobyte", "reference"], default="autobyte")
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--no-sync", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    if a.backend == "reference":
        ranks = range(a.world)
    else:
        import autobyte.torch as ab
        ab.init()
        ranks = [ab.rank()]
        opt = ab.DistributedOptimizer(opt, model)
    # avg_fn rather than torch 2's get_ema_multi_avg_fn: torch 1.13 has only the former.
    ema = torch.optim.swa_utils.AveragedModel(model, avg_fn=lambda avg, new, n: 0.8 * avg + 0.2 * new)
    for step in range(STEPS):
        opt.zero_grad()
        # The reference sums every rank's loss over the world, as the
        # averaged gradients of the workers do.
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (batch(r, step) for r in ranks)) / len(ranks)
        loss.backward()
        opt.step()
        if a.backend == "autobyte" and not a.no_sync:
            opt.synchronize()
        if a.case == "clamp":
            with torch.no_grad():
                for q in model.parameters():
                    q.clamp_(-CLAMP, CLAMP)
        else:
            ema.update_parameters(model)
    if a.backend == "autobyte":
        opt.synchronize()
    if a.backend == "reference" or ab.rank() == 0:
        state = {"model." + k: v for k, v in model.state_dict().items()}
        state.update({"ema." + k: v for k, v in ema.module.state_dict().items()})
        torch.save(state, a.out)
    print("rank %d checksum %.9g" % (ranks[0], sum(float(v.double().sum()) for v in model.state_dict().values())), flush=True)


if __name__ == "__main__":
    main()
