"""A DDP training script as people write it, with nothing of autobyte in
it, for test_dropin.py: run as it is it trains through torch's DDP on
gloo; run as ``python -m autobyte.torch.dropin ddp_script.py ...`` it
trains through autobyte.

    ddp_script.py --out FILE                 (RANK, WORLD_SIZE, MASTER_* set: a launcher or torchrun)
    ddp_script.py --out FILE --spawn N PORT  (torch.multiprocessing.spawn of N ranks, each setting
                                              MASTER_ADDR and MASTER_PORT itself: the DDP tutorial's way)

What it uses, as such scripts do: init_process_group("gloo"), a model
with BatchNorm, DDP with keyword arguments and the world group, a
DistributedSampler over a dataset with set_epoch, SGD with momentum and a
learning-rate schedule, gradient clipping, a loss averaged over the ranks
with all_reduce for the log, a checkpoint of model.module, a barrier.
Every rank draws its own initial weights, so the wrapper must broadcast
rank 0's. Rank 0 saves its per-step losses, the averaged losses, the final
state and what the wrapper was to FILE, rank R to FILE.rankR. --ignore
keeps a parameter and a buffer out of DDP's reach
(_set_params_and_buffers_to_ignore_for_model).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, 8, 8, generator=g)
    return TensorDataset(x, (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long())


def train(rank, world, out, port=None, ignore=False):
    if port is not None:
        # The DDP tutorial's setup(), in the spawned worker itself.
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(1 + rank)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    if ignore:
        # Kept apart on each rank: the last layer's bias and BatchNorm's
        # running mean (names relative to the module, as DDP takes them).
        DDP._set_params_and_buffers_to_ignore_for_model(model, ["4.bias", "1.running_mean"])
    ddp = DDP(model, process_group=dist.group.WORLD, bucket_cap_mb=1, find_unused_parameters=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(dataset(), batch_size=6, sampler=sampler)
    losses, averaged = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
            sched.step()
            losses.append(loss.item())
            total = loss.detach().clone()
            dist.all_reduce(total)
            averaged.append(total.item() / world)
    torch.save({"losses": losses, "averaged": averaged, "state": ddp.module.state_dict(),
                "keys": sorted(ddp.state_dict()), "wrapper": type(ddp).__module__,
                "is_ddp": isinstance(ddp, torch.nn.parallel.DistributedDataParallel)},
               out if rank == 0 else "%s.rank%d" % (out, rank))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--spawn", nargs=2, type=int, metavar=("N", "PORT"))
    p.add_argument("--ignore", action="store_true", help="keep a parameter and a buffer out of DDP's reach")
    a = p.parse_args()
    if a.spawn:
        n, port = a.spawn
        mp.spawn(train, args=(n, a.out, port, a.ignore), nprocs=n, join=True)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a.out, ignore=a.ignore)


if __name__ == "__main__":
    main()
