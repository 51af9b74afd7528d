"""A GAN trained through autobyte.torch.DistributedDataParallel, for
test_ddp_wrapper.py: a generator and a discriminator with an optimizer
each, wrapped together as one nn.ModuleDict, or (--separate) each in its
own wrapper, as DDP scripts do (the two wrappers share one session).
Each step trains the discriminator on a real and a generated batch (the
generator's output detached), then the generator through the
discriminator; each backward pass averages every gradient of both models
over the workers, and each optimizer steps its own model.

Rank r saves its final parameters to OUT.rankR; rank 0 also trains the
same job in one process (each step's losses over all ranks' batches,
divided by the number of workers) and saves that to OUT.reference.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

STEPS = 5


def make():
    torch.manual_seed(0)
    return nn.ModuleDict({"g": nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8)),
                          "d": nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))})


def batch(rank, k):
    g = torch.Generator().manual_seed(100 * rank + k)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def train(nets, ranks, scale):
    """ranks: whose batches this process trains on; scale: each loss's factor."""
    bce = nn.BCEWithLogitsLoss()
    G, D = nets["g"], nets["d"]
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    for k in range(STEPS):
        opt_d.zero_grad()
        for r in ranks:
            real, z = batch(r, k)
            fake = G(z).detach()
            ((bce(D(real), torch.ones(6, 1)) + bce(D(fake), torch.zeros(6, 1))) * scale).backward()
        opt_d.step()
        opt_g.zero_grad()
        for r in ranks:
            _, z = batch(r, k)
            (bce(D(G(z)), torch.ones(6, 1)) * scale).backward()
        opt_g.step()


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--separate", action="store_true", help="a wrapper per model")
    a = ap.parse_args()
    import autobyte.torch as ab
    ab.init()
    rank, world = ab.rank(), ab.size()
    nets = make()
    if a.separate:
        train({"g": ab.DistributedDataParallel(nets["g"]), "d": ab.DistributedDataParallel(nets["d"])}, [rank], 1.0)
    else:
        gan = ab.DistributedDataParallel(nets)  # both models' parameters, one session
        train(gan.module, [rank], 1.0)
    torch.save(flat(nets), "%s.rank%d" % (a.out, rank))
    if rank == 0:
        ref = make()
        train(ref, list(range(world)), 1.0 / world)
        torch.save(flat(ref), a.out + ".reference")
    ab.shutdown()


if __name__ == "__main__":
    main()
