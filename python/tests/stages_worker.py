"""Two training stages, each with its own DistributedOptimizer, one after
the other in one process (as scripts that train a head and then fine-tune
the whole model do): stage 1 trains the head alone, autobyte.torch.shutdown()
ends it, and stage 2 distributes a new optimizer over the whole model.
--backend autobyte-ddp does the same as a DDP script: each stage wraps the
model in autobyte.torch.DistributedDataParallel with a plain optimizer, and
deleting stage 1's wrapper (del net) releases it for stage 2's.

    stages_worker.py --out FILE [--backend autobyte|autobyte-ddp|reference] [--world N]

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
    p.add_argument("--backend", choices=["autobyte", "autobyte-ddp", "reference"], default="autobyte")
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
        if a.backend == "autobyte-ddp":
            net = ab.DistributedDataParallel(model)
            opt = torch.optim.SGD(params, lr=0.1)
        else:
            net = model
            opt = ab.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), model)
        for step in range(STEPS):
            opt.zero_grad()
            x, y = batch(rank, stage, step)
            loss_fn(net(x), y).backward()
            opt.step()
        if a.backend == "autobyte-ddp":
            del net  # no shutdown(): the next wrapping closes a deleted wrapper's session
        else:
            opt.synchronize()
            ab.shutdown()
    if rank == 0:
        torch.save(model.state_dict(), a.out)
    print("rank %d checksum %.9f" % (rank, sum(v.double().sum().item() for v in model.state_dict().values())))


if __name__ == "__main__":
    main()
