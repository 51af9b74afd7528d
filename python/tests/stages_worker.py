"""Two training stages, each with its own DistributedOptimizer, one after
the other in one process (as scripts that train a head and then fine-tune
the whole model do): stage 1 trains the head alone, autobyte.torch.shutdown()
ends it, and stage 2 distributes a new optimizer over the whole model.

    stages_worker.py --out FILE [--backend autobyte|reference] [--world N]

--backend reference computes the exact update in one process (the batches of
every rank at once); rank 0 of an autobyte run saves its parameters to FILE
and every rank prints its checksum.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

STEPS = 3


def batch(rank, stage, step):
    g = torch.Generator().manual_seed(1000 * stage + 10 * step + rank)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--backend", choices=["autobyte", "reference"], default="autobyte")
    p.add_argument("--world", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(0)
    body, head = torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)
    model = torch.nn.Sequential(body, torch.nn.Tanh(), head)
    loss_fn = torch.nn.functional.mse_loss
    if a.backend == "reference":
        ranks = range(a.world)
        for stage, params in ((1, head.parameters()), (2, model.parameters())):
            opt = torch.optim.SGD(params, lr=0.1)
            for step in range(STEPS):
                opt.zero_grad()
                xs, ys = zip(*(batch(r, stage, step) for r in ranks))
                loss_fn(model(torch.cat(xs)), torch.cat(ys)).backward()
                opt.step()
        torch.save(model.state_dict(), a.out)
        return
    import autobyte.torch as ab
    ab.init()
    rank = ab.rank()
    for p_ in body.parameters():  # stage 1: the body is frozen
        p_.requires_grad_(False)
    for stage in (1, 2):
        if stage == 2:
            for p_ in body.parameters():
                p_.requires_grad_(True)
        params = head.parameters() if stage == 1 else model.parameters()
        opt = ab.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), model)
        for step in range(STEPS):
            opt.zero_grad()
            x, y = batch(rank, stage, step)
            loss_fn(model(x), y).backward()
            opt.step()
        opt.synchronize()
        ab.shutdown()
    if rank == 0:
        torch.save(model.state_dict(), a.out)
    print("rank %d checksum %.9f" % (rank, sum(v.double().sum().item() for v in model.state_dict().values())))


if __name__ == "__main__":
    main()
