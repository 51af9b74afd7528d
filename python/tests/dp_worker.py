"""A data-parallel training run for the plugin's tests.

Every rank trains the same model on its own synthetic batches (seeded by
rank); the result (rank 0's per-step losses, the final parameters and
buffers) is saved with torch.save to --out by rank 0, to --out.rankR by the
others.

--backend reference runs in one process what the N workers compute
together: each step sums the N ranks' losses divided by N (one forward per
rank's batch, so BatchNorm sees the same batches) and steps once. That is
the exact data-parallel update, against which autobyte is compared.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn as nn


class Smooth(nn.Module):
    """Conv + tanh + linear: no kinks, so rounding differences stay small."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 64)
        self.fc2 = nn.Linear(64, 5)

    def forward(self, x, step):
        h = torch.tanh(self.conv(x))
        return self.fc2(torch.tanh(self.fc1(h.flatten(1))))


class Features(nn.Module):
    """Shared, frozen, sometimes-unused parameters and BatchNorm buffers."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(12, 16, bias=False)  # a bias before BatchNorm has no gradient: only rounding noise, which Adam would amplify
        self.bn = nn.BatchNorm1d(16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.weight.requires_grad_(False)  # frozen weight, trainable bias
        self.branch = nn.Linear(16, 16)  # used on even steps only
        self.out = nn.Linear(16, 12, bias=False)
        self.out.weight = self.embed.weight  # registered twice: one tensor, two modules
        self.out2 = nn.Linear(16, 4)

    def forward(self, x, step):
        h = torch.tanh(self.bn(self.embed(x)))
        h = torch.tanh(self.frozen(h))
        if step % 2 == 0:
            h = h + torch.tanh(self.branch(h))
        recon = h @ self.embed.weight  # the shared weight, a second time
        return self.out2(h) + 0.01 * recon.sum(dim=1, keepdim=True)


class Attention(nn.Module):
    """MultiheadAttention uses out_proj's weight without calling out_proj."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x, step):
        h, _ = self.attn(x, x, x, need_weights=False)
        return self.head(torch.tanh(h).mean(dim=1))


def batch(model_name, gen, n):
    if model_name == "attention":
        return torch.randn(n, 5, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    if model_name == "smooth":
        return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 5, (n,), generator=gen)
    return torch.randn(n, 12, generator=gen), torch.randint(0, 4, (n,), generator=gen)


def make_opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-2)
    raise SystemExit("unknown optimizer " + name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["autobyte", "ddp", "reference"], required=True)
    p.add_argument("--model", choices=["smooth", "features", "attention"], default="smooth")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=3, help="reference: how many workers to emulate")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="")
    p.add_argument("--die-at", type=int, default=-1, help="rank --die-rank kills itself (SIGKILL) at this step")
    p.add_argument("--die-rank", type=int, default=2)
    p.add_argument("--die-stamp", default="", help="file the dying rank writes its time of death to")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = a.workers if a.backend == "reference" else int(os.environ.get("WORLD_SIZE", "1"))
    # Different initial weights per rank: the broadcast must make them equal.
    torch.manual_seed(a.seed + (rank if a.backend != "reference" else 0))
    model = {"smooth": Smooth, "features": Features, "attention": Attention}[a.model]()
    losses = []
    if a.backend == "reference":
        opt = make_opt(a.optimizer, [q for q in model.parameters() if q.requires_grad])
        gens = [torch.Generator().manual_seed(a.seed * 1000 + r) for r in range(world)]
        for step in range(a.iterations):
            opt.zero_grad()
            total = 0
            for r in range(world):
                x, y = batch(a.model, gens[r], a.batch)
                loss = nn.functional.cross_entropy(model(x, step), y)
                if r == 0:
                    losses.append(loss.item())
                total = total + loss / world
            total.backward()
            opt.step()
    else:
        gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
        params = [q for q in model.parameters() if q.requires_grad]
        if a.backend == "ddp":
            import torch.distributed as dist
            dist.init_process_group("gloo")
            net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
            opt = make_opt(a.optimizer, params)
        else:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
            import autobyte.torch as ab
            ab.init()
            net = model
            opt = ab.DistributedOptimizer(make_opt(a.optimizer, params), model)
        for step in range(a.iterations):
            if step == a.die_at and rank == a.die_rank:
                if a.die_stamp:
                    with open(a.die_stamp, "w") as f:
                        f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(a.model, gen, a.batch)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x, step), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if a.backend == "autobyte":
            opt.synchronize()
    if a.out:
        torch.save({"losses": losses, "state": model.state_dict()}, a.out if rank == 0 else "%s.rank%d" % (a.out, rank))
    print("done", rank, flush=True)


if __name__ == "__main__":
    main()
