"""The torch.multiprocessing.spawn idiom of PyTorch's DDP tutorial: one
parent starts the workers, and each passes its rank and the world size to
init, as it would to init_process_group; nothing sets RANK or WORLD_SIZE.
Each of 2 workers trains a linear model with plain SGD on its own batches
for 5 steps; the parent checks that both end equal to the exact
data-parallel update (one process, the mean of both ranks' gradients).

    python spawn_worker.py PORT OUT   (autobyte's rank 0 listens at PORT+1; OUT.R is rank R's result)
"""

import os
import sys

import torch
import torch.multiprocessing as mp

STEPS, WORLD = 5, 2


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def work(rank, port, out):
    import autobyte.torch as ab
    ab.init(rank=rank, world_size=WORLD, master_addr="127.0.0.1", master_port=port, rendezvous_timeout="60s")
    assert (ab.rank(), ab.size()) == (rank, WORLD), (ab.rank(), ab.size())
    m = model()
    opt = ab.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    opt.synchronize()
    torch.save(m.state_dict(), "%s.%d" % (out, rank))


def exact():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        for r in range(WORLD):
            x, y = batch(r, step)
            (torch.nn.functional.mse_loss(m(x), y) / WORLD).backward()
        opt.step()
    return m.state_dict()


if __name__ == "__main__":
    port, out = int(sys.argv[1]), sys.argv[2]
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "AUTOBYTE_MASTER_PORT", "AUTOBYTE_SERVERS", "AUTOBYTE_ARCH"):
        os.environ.pop(k, None)
    os.environ.setdefault("AUTOBYTE_TOKEN", "spawn-test")
    mp.spawn(work, args=(port, out), nprocs=WORLD, join=True)
    want = exact()
    for r in range(WORLD):
        got = torch.load("%s.%d" % (out, r))
        for k in want:
            diff = (got[k] - want[k]).abs().max().item()
            print("rank %d %s max difference %.3g" % (r, k, diff))
            assert diff <= 1e-6, (r, k, diff)
    print("spawned workers match the exact update", flush=True)
