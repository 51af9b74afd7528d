"""A training run with uneven inputs for test_join.py.

Rank r trains STEPS[r % len(STEPS)] steps (--steps, e.g. "3,7,0") inside
optimizer.join(), on its own seeded batches, with AdamW and a learning
rate that changes every step (LambdaLR), so that a worker that has joined
must apply the others' updates with their hyper-parameters, not its own.
Every rank saves its final parameters and optimizer state to OUT.rankR,
and the learning rate its optimizer held after each of its own steps.

--backend reference computes the same job in one process: step k sums
the gradients of the ranks that still train at k, each over the number of
workers (DDP's Join divides by the initial world size; --divide-by-active:
over the number of those ranks), and steps once. --backend autobyte-ddp
and ddp run DDP's interface (see wrapped()).
--mode picks a fault: "synced" (rank 1 calls sync_gradients at step 4,
when the others have joined), "raise" (rank 1 raises inside join()), "no-flag" (join()
without uneven_inputs=True). --throw: join(throw_on_early_termination=True),
every rank noting the error it caught.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(rank, k):
    g = torch.Generator().manual_seed(1000 * rank + k)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def make_opt(params):
    opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + 0.3 * k))
    return opt, sched


def loss_of(m, x, y):
    return nn.functional.cross_entropy(m(x), y)


def params(m):
    return {"param." + n: p.detach().clone() for n, p in m.named_parameters()}


def state(m, opt):
    out = params(m)
    sd = opt.state_dict()
    for i, s in sd["state"].items():
        for k, v in s.items():
            if torch.is_tensor(v):
                out["opt.%s.%s" % (i, k)] = v.clone()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["autobyte", "autobyte-ddp", "ddp", "reference"], required=True,
                    help="autobyte-ddp: autobyte.torch.DistributedDataParallel and model.join(); ddp: torch's")
    ap.add_argument("--divide-by-active", action="store_true",
                    help="autobyte-ddp and ddp: join(divide_by_initial_world_size=False)")
    ap.add_argument("--steps", required=True)
    ap.add_argument("--workers", type=int, default=3, help="reference: how many workers")
    ap.add_argument("--mode", default="ok", choices=["ok", "synced", "raise", "no-flag"])
    ap.add_argument("--throw", action="store_true",
                    help="autobyte-ddp and ddp: join(throw_on_early_termination=True); the error is caught and noted")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    m = make_model()
    if a.backend == "reference":
        n = a.workers
        counts = [steps[r % len(steps)] for r in range(n)]
        opt, sched = make_opt(m.parameters())
        for k in range(max(counts)):
            opt.zero_grad()
            active = sum(1 for r in range(n) if counts[r] > k)
            for r in range(n):
                if counts[r] > k:
                    x, y = batch(r, k)
                    (loss_of(m, x, y) / (active if a.divide_by_active else n)).backward()
            opt.step()
            sched.step()
        torch.save({"state": state(m, opt)}, a.out)
        return
    if a.backend in ("autobyte-ddp", "ddp"):
        wrapped(a, m, steps)
        return
    import autobyte.torch as ab
    ab.init()
    rank = ab.rank()
    opt, sched = make_opt(m.parameters())
    opt = ab.DistributedOptimizer(opt, m, uneven_inputs=a.mode != "no-flag")
    lrs = []
    with opt.join():
        for k in range(steps[rank % len(steps)]):
            x, y = batch(rank, k)
            opt.zero_grad()
            loss_of(m, x, y).backward()
            if a.mode == "raise" and rank == 1 and k == 1:
                raise RuntimeError("rank 1 fails inside join()")
            if a.mode == "synced" and rank == 1 and k == 4:
                opt.sync_gradients()
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
    after = opt.param_groups[0]["lr"]
    opt.synchronize()
    torch.save({"state": state(m, opt), "lrs": lrs, "lr_after_join": after}, "%s.rank%d" % (a.out, rank))


def wrapped(a, m, steps):
    """DDP's interface: the model wrapped, the script's own optimizer and
    scheduler, the loop inside model.join(). Only the parameters are saved:
    a joined worker's optimizer does not step (DDP's Join), so optimizer
    states differ between workers."""
    if a.backend == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        net = nn.parallel.DistributedDataParallel(m)
    else:
        import autobyte.torch as ab
        ab.init()
        rank = ab.rank()
        net = ab.DistributedDataParallel(m)
    opt, sched = make_opt(net.parameters())
    raised = None
    try:
        with net.join(divide_by_initial_world_size=not a.divide_by_active, throw_on_early_termination=a.throw):
            for k in range(steps[rank % len(steps)]):
                x, y = batch(rank, k)
                opt.zero_grad()
                loss_of(net, x, y).backward()
                opt.step()
                sched.step()
    except RuntimeError as e:
        if not (a.throw and "exhausted" in str(e)):
            raise
        raised = str(e)
    torch.save({"state": params(m), "raised": raised}, "%s.rank%d" % (a.out, rank))
    if a.backend == "ddp":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
