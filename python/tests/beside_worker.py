"""A training script that uses torch.distributed beside autobyte, as real
scripts do: gloo for a metric's all-reduce and DistributedSampler, the
plugin for the gradients. argv[1] says whether init_process_group comes
before or after ab.init(). Run under `autobyte launch` (2 workers)."""

import sys

import torch
import torch.distributed as dist

import autobyte.torch as ab

order = sys.argv[1]
if order == "before":
    dist.init_process_group("gloo")
ab.init()
if order == "after":
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = ab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(1)), torch.randn(32, 1))
sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
assert sampler.num_replicas == ab.size() and sampler.rank == ab.rank(), (sampler.num_replicas, sampler.rank)
for x, y in torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
total = loss.detach().clone()
dist.all_reduce(total)
opt.synchronize()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(ab.size())]
dist.all_gather(gathered, flat)
if ab.rank() == 0:
    print("rank 0: loss sum over ranks %.6f" % total.item())
print("same parameters: %s" % all(torch.equal(g, gathered[0]) for g in gathered), flush=True)
dist.barrier()
dist.destroy_process_group()
