"""A data-parallel training run for the plugin's tests.

Every rank trains the same model on its own synthetic batches (seeded by
rank; a resumed run draws and drops the batches of the steps it skips);
the result (rank 0's per-step losses, the final parameters and buffers) is
saved with torch.save to --out by rank 0, to --out.rankR by the others.

--backend reference runs in one process what the N workers compute
together: each step sums the N ranks' losses divided by N (one forward per
rank's batch, so BatchNorm sees the same batches) and steps once. That is
the exact data-parallel update, against which autobyte is compared.

--optimizer may list several optimizers (a,b,c): one job then trains a
fresh model with each in turn, saved to --out.NAME (with autobyte, one
session after another, which ring all-reduce allows: parameter servers
leave with the first session).
"""

import argparse
import contextlib
import inspect
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


class SparseEmbedding(nn.Module):
    """A recommendation model's shape: sparse embedding bags, whose
    gradients are sparse, feeding dense layers."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(40, 8, mode="mean", sparse=True)
        self.item = nn.Embedding(30, 8, sparse=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x, step):
        h = torch.cat([self.bag(x[:, :3]), self.item(x[:, 3] % 30)], dim=1)
        return self.fc(torch.tanh(h))


class Checkpointed(nn.Module):
    """Activation checkpointing (torch.utils.checkpoint), as large models
    train: each block's forward runs again inside backward. Odd blocks use
    the reentrant implementation (torch 1.13's default), even ones the
    non-reentrant one."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)) for _ in range(4))
        self.out = nn.Linear(16, 4)

    def forward(self, x, step):
        from torch.utils.checkpoint import checkpoint
        h = torch.tanh(self.inp(x))
        for i, b in enumerate(self.blocks):
            h = h + checkpoint(b, h, use_reentrant=i % 2 == 1)
        return self.out(h)


class WeightNormed(nn.Module):
    """Reparametrised weights: nn.utils.weight_norm's weight_g and weight_v
    (a forward pre-hook recomputes the weight) and, where torch has it,
    parametrizations.weight_norm's original0 and original1 (held by a
    ParametrizationList, not by the layer that uses them)."""

    def __init__(self):
        super().__init__()
        self.a = nn.utils.weight_norm(nn.Linear(12, 16))
        self.b = nn.Linear(16, 16)
        if hasattr(nn.utils, "parametrizations") and hasattr(nn.utils.parametrizations, "weight_norm"):
            self.b = nn.utils.parametrizations.weight_norm(self.b)
        self.out = nn.Linear(16, 4)

    def forward(self, x, step):
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))


class Recurrent(nn.Module):
    """An embedding, a 2-layer LSTM and a GRU: recurrent modules hold
    their weights as a flat list the kernel reads (_flat_weights)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30, 8)
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.gru = nn.GRU(12, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x, step):
        h, _ = self.lstm(self.embed(x))
        h, _ = self.gru(h)
        return self.head(h[:, -1])


MODELS = {"smooth": Smooth, "features": Features, "attention": Attention, "sparse": SparseEmbedding,
          "checkpointed": Checkpointed, "weightnorm": WeightNormed,
          "recurrent": Recurrent}


def batch(model_name, gen, n):
    if model_name == "attention":
        return torch.randn(n, 5, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    if model_name == "recurrent":
        return torch.randint(0, 30, (n, 6), generator=gen), torch.randint(0, 4, (n,), generator=gen)
    if model_name == "sparse":
        return torch.randint(0, 40, (n, 4), generator=gen), torch.randint(0, 4, (n,), generator=gen)
    if model_name == "smooth":
        return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 5, (n,), generator=gen)
    return torch.randn(n, 12, generator=gen), torch.randint(0, 4, (n,), generator=gen)


def batches(seed, rank):
    """Rank's generator of batches: one draw per micro-batch, step after step."""
    return torch.Generator().manual_seed(seed * 1000 + rank)


# name -> (class name in torch.optim, keyword arguments). The settings make
# each one move the test model visibly in a few steps.
OPTIMIZERS = {
    "sgd": ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=1e-4)),
    "nesterov": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)),
    "adam": ("Adam", dict(lr=1e-2)),
    "adamw": ("AdamW", dict(lr=1e-2, weight_decay=0.05)),
    "adagrad": ("Adagrad", dict(lr=0.05, lr_decay=0.01)),
    "rmsprop": ("RMSprop", dict(lr=1e-3, momentum=0.5, centered=True)),
    "adadelta": ("Adadelta", dict(lr=1.0)),
    "adamax": ("Adamax", dict(lr=2e-2)),
    "nadam": ("NAdam", dict(lr=1e-2)),
    "radam": ("RAdam", dict(lr=1e-2)),
    "asgd": ("ASGD", dict(lr=0.05, t0=3)),  # t0=3: averaging starts within the run
    "rprop": ("Rprop", dict(lr=0.01)),
    "adafactor": ("Adafactor", dict(lr=0.01)),
    "muon": ("Muon", dict(lr=0.02)),
}

# For the sparse model, beside OPTIMIZERS (whose every entry
# test_optimizers runs): SGD without weight decay, which torch's SGD refuses
# with sparse gradients; and two optimizers, as a recommendation model's
# script has them: SparseAdam for the sparse embeddings, Adam for the rest
# (only where the script owns the optimizers: reference, ddp, autobyte-ddp).
SPARSE_OPTIMIZERS = {
    "momentum": ("SGD", dict(lr=0.05, momentum=0.9)),
    "sparseadam+adam": (None, dict(lr=1e-2)),
}


class Optimizers:
    """Several optimizers stepped as one."""

    def __init__(self, *opts):
        self.opts = opts

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()

    def step(self):
        for o in self.opts:
            o.step()

    def state_dict(self):
        return [o.state_dict() for o in self.opts]


def implementations(cls):
    """The implementations of cls this torch runs on the CPU, of
    'for-loop', 'foreach' and 'fused' (a per-group option)."""
    accepted = inspect.signature(cls.__init__).parameters
    have = ["for-loop"]
    for impl in ("foreach", "fused"):
        if impl not in accepted:
            continue
        try:
            p = torch.nn.Parameter(torch.ones(2, 2))
            o = cls([p], lr=0.01, **{impl: True})
            p.grad = torch.ones(2, 2)
            o.step()
        except (RuntimeError, ValueError, TypeError):
            continue  # e.g. torch 1.13's fused Adam needs CUDA
        have.append(impl)
    return have


def impl_options(cls, impl):
    accepted = inspect.signature(cls.__init__).parameters
    if impl == "for-loop":
        return {"foreach": False} if "foreach" in accepted else {}
    return {impl: True}


def make_opt(name, model, groups):
    """name's optimizer over the model's trainable parameters. With groups:
    one parameter group per top-level module, each with its own
    hyper-parameters and, where this torch has them, implementations
    (for-loop, foreach, fused)."""
    cls_name, kw = OPTIMIZERS[name] if name in OPTIMIZERS else SPARSE_OPTIMIZERS[name]
    params = [q for q in model.parameters() if q.requires_grad]
    if name == "sparseadam+adam":
        sparse = [m.weight for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
        dense = [q for q in params if all(q is not w for w in sparse)]
        return Optimizers(torch.optim.SparseAdam(sparse, **kw), torch.optim.Adam(dense, **kw))
    cls = getattr(torch.optim, cls_name)
    if cls_name == "Muon":
        params = [q for q in params if q.dim() == 2]  # Muon updates matrices only
    if not groups:
        return cls(params, **kw)
    impls = implementations(cls)
    accepted = inspect.signature(cls.__init__).parameters
    wanted = set(id(q) for q in params)
    out = []
    for i, (_, mod) in enumerate(model.named_children()):
        ps = [q for q in mod.parameters() if id(q) in wanted]
        if not ps:
            continue
        g = {"params": ps, "lr": kw["lr"] * (1.0, 0.5, 2.0)[i % 3]}
        if i % 3 == 2 and "weight_decay" in accepted:
            g["weight_decay"] = 1e-3
        g.update(impl_options(cls, impls[i % len(impls)]))
        out.append(g)
    return cls(out, **kw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["autobyte", "autobyte-ddp", "ddp", "reference"], required=True,
                   help="autobyte-ddp: autobyte.torch.DistributedDataParallel and the plain optimizer, as a DDP script has")
    p.add_argument("--model", choices=sorted(MODELS), default="smooth")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--groups", action="store_true", help="one parameter group per top-level module (make_opt)")
    p.add_argument("--scheduler", action="store_true", help="StepLR: halve the learning rates every 3 steps")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches (backward passes) per step")
    p.add_argument("--accumulate-with", choices=["no_sync", "passes", "flag"], default="no_sync",
                   help="autobyte: optimizer.no_sync() or backward_passes_per_step (ddp: model.no_sync()); "
                   "ddp, autobyte-ddp: flag sets model.require_backward_grad_sync instead of no_sync()")
    p.add_argument("--workers", type=int, default=3, help="reference: how many workers to emulate")
    p.add_argument("--seed", type=int, default=7, help="seed of the batches and, unless --init-seed, of the initial weights")
    p.add_argument("--init-seed", type=int, default=None)
    p.add_argument("--out", default="")
    p.add_argument("--checkpoint-at", type=int, default=-1, help="every rank saves a checkpoint after this many steps, then goes on")
    p.add_argument("--checkpoint", default="", help="the checkpoint's file (rank R: FILE.rankR)")
    p.add_argument("--resume", default="", help="a checkpoint to load after wrapping the optimizer, then train to --iterations")
    p.add_argument("--die-at", type=int, default=-1, help="rank --die-rank kills itself (SIGKILL) at this step")
    p.add_argument("--die-rank", type=int, default=2)
    p.add_argument("--die-stamp", default="", help="file the dying rank writes its time of death to")
    p.add_argument("--stall", action="store_true",
                   help="rank --die-rank stalls (sleeps 60 s, its process alive) at step --die-at instead of dying")
    p.add_argument("--other-model-rank", type=int, default=-1,
                   help="this rank trains another model (attention instead of --model, else features): a job started wrong")
    p.add_argument("--comm-hook", choices=["bf16", "fp16", "fp16-wrapper", "builtin-fp16"], default=None,
                   help="ddp and autobyte-ddp: register DDP's bf16_compress_hook, fp16_compress_hook, "
                        "fp16_compress_wrapper(allreduce_hook) or the built-in FP16_COMPRESS after wrapping")
    p.add_argument("--short-rank", type=int, default=-1,
                   help="this rank runs half the iterations and ends normally, as one that runs out of data first")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = a.workers if a.backend == "reference" else int(os.environ.get("WORLD_SIZE", "1"))
    names = a.optimizer.split(",")
    for name in names:
        if name not in OPTIMIZERS and name not in SPARSE_OPTIMIZERS:
            raise SystemExit("unknown optimizer %r (known: %s)" % (name, ", ".join(list(OPTIMIZERS) + list(SPARSE_OPTIMIZERS))))
    if a.backend == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    for name in names:
        out = a.out if len(names) == 1 or not a.out else "%s.%s" % (a.out, name)
        train(a, name, rank, world, out)
    if a.backend == "ddp":
        # Left to interpreter exit, gloo's threads are torn down while still
        # joinable on torch 2.x ("terminate called without an active
        # exception", SIGABRT after the run succeeded).
        dist.barrier()
        dist.destroy_process_group()
    print("done", rank, flush=True)


def plugin():
    """autobyte.torch from this checkout, initialised."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import autobyte.torch as ab
    ab.init()
    return ab


def register_comm_hook(net, which):
    if which is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    if which == "builtin-fp16":
        import torch.distributed as dist
        net.register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif which == "fp16-wrapper":
        net.register_comm_hook(None, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook))
    else:
        net.register_comm_hook(None, getattr(default_hooks, which + "_compress_hook"))


def train(a, opt_name, rank, world, out):
    # Different initial weights per rank: the broadcast must make them equal.
    init = a.seed if a.init_seed is None else a.init_seed
    torch.manual_seed(init + (rank if a.backend != "reference" else 0))
    name = a.model
    if rank == a.other_model_rank:
        name = "attention" if a.model != "attention" else "features"
    model = MODELS[name]()
    losses = []
    K = a.accumulate
    first = 0
    if a.backend == "reference":
        opt = make_opt(opt_name, model, a.groups)
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5) if a.scheduler else None
        gens = [batches(a.seed, r) for r in range(world)]
        for step in range(a.iterations):
            opt.zero_grad()
            for m in range(K):
                total = 0
                for r in range(world):
                    x, y = batch(a.model, gens[r], a.batch)
                    loss = nn.functional.cross_entropy(model(x, step), y) / K
                    if r == 0 and m == K - 1:
                        losses.append(loss.item())
                    total = total + loss / world
                total.backward()
            opt.step()
            if sched:
                sched.step()
    else:
        if a.backend == "ddp":
            # find_unused_parameters: the features model skips a branch on
            # odd steps; broadcast_buffers=False: buffers are broadcast once
            # at start, as autobyte does.
            net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False,
                                                      find_unused_parameters=a.model == "features")
            register_comm_hook(net, a.comm_hook)
            opt = make_opt(opt_name, model, a.groups)
            no_sync = net.no_sync
        elif a.backend == "autobyte-ddp":
            ab = plugin()
            net = ab.DistributedDataParallel(model, broadcast_buffers=False, find_unused_parameters=a.model == "features")
            register_comm_hook(net, a.comm_hook)
            opt = make_opt(opt_name, model, a.groups)
            no_sync = net.no_sync
        else:
            ab = plugin()
            net = model
            passes = K if a.accumulate_with == "passes" else 1
            opt = ab.DistributedOptimizer(make_opt(opt_name, model, a.groups), model, backward_passes_per_step=passes)
            no_sync = opt.no_sync if a.accumulate_with == "no_sync" else None
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5) if a.scheduler else None
        if a.resume:
            # Every rank loads its own checkpoint into the wrapped optimizer
            # mid-job (the parameters were broadcast from rank 0's fresh ones).
            ck = torch.load("%s.rank%d" % (a.resume, rank))
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            if sched:
                sched.load_state_dict(ck["scheduler"])
            first, losses = ck["step"], ck["losses"]
        gen = batches(a.seed, rank)
        for _ in range(first * K):
            batch(a.model, gen, a.batch)
        for step in range(first, a.iterations):
            if rank == a.short_rank and step == a.iterations // 2:
                break
            if step == a.die_at and rank == a.die_rank and a.stall:
                time.sleep(60)
            elif step == a.die_at and rank == a.die_rank:
                if a.die_stamp:
                    with open(a.die_stamp, "w") as f:
                        f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            for m in range(K):
                x, y = batch(a.model, gen, a.batch)
                last = m == K - 1
                held = contextlib.nullcontext()
                if a.accumulate_with == "flag" and a.backend in ("ddp", "autobyte-ddp"):
                    # What some training libraries do in place of no_sync().
                    net.require_backward_grad_sync = last
                elif not last and no_sync is not None:
                    held = no_sync()
                with held:
                    loss = nn.functional.cross_entropy(net(x, step), y) / K
                    loss.backward()
            opt.step()
            if sched:
                sched.step()
            losses.append(loss.item())
            if step + 1 == a.checkpoint_at:
                # Copied at once, as writing it to disk would: state_dict()
                # itself must hold the parameters after this step's update.
                model_sd = {k: v.clone() for k, v in model.state_dict().items()}
                torch.save({"model": model_sd, "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict() if sched else None, "step": step + 1, "losses": list(losses)},
                           "%s.rank%d" % (a.checkpoint, rank))
        if a.backend == "autobyte":
            opt.synchronize()
    if out:
        # Which gradients the last backward left sparse (the wrapper hands
        # sparse embeddings' sums back sparse, as DDP does).
        sparse = {n: q.grad is not None and q.grad.is_sparse for n, q in model.named_parameters()}
        # How many backward passes the wrapper synchronised: one per step
        # where the others of a step only accumulate.
        synced = net._autobyte.iteration if a.backend == "autobyte-ddp" else None
        torch.save({"losses": losses, "state": model.state_dict(), "sparse_grads": sparse, "synced": synced},
                   out if rank == 0 else "%s.rank%d" % (out, rank))
    if a.backend in ("autobyte", "autobyte-ddp"):
        ab.shutdown()


if __name__ == "__main__":
    main()
