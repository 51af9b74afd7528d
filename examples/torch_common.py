"""Shared scaffolding of the PyTorch examples: flags, the two backends
(autobyte and torch DDP on gloo), timing and the result line."""

import argparse
import json
import os
import sys
import time

import torch


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", choices=["autobyte", "ddp", "local"], default="autobyte",
                   help="autobyte (the plugin), ddp (torch DistributedDataParallel on gloo) or local (one process, no communication)")
    p.add_argument("--iterations", type=int, default=30, help="training steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the steady-state iteration time")
    p.add_argument("--seed", type=int, default=1, help="seed of the initial weights and of the synthetic data")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: 0.01 for sgd, 1e-3 for adam/adamw)")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd momentum")
    p.add_argument("--nesterov", action="store_true", help="sgd: Nesterov momentum")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--save", default="", help="rank 0 saves the final parameters (state_dict) to this file")
    p.add_argument("--save-init", default="", help="rank 0 saves the initial parameters (state_dict) to this file")
    p.add_argument("--losses", action="store_true", help="include rank 0's loss of every step in the result")
    p.add_argument("--compile", choices=["", "model", "layers"], default="",
                   help="train torch.compile(model) (torch 2). autobyte: 'model' hands the compiled module to "
                        "DistributedOptimizer (the forward waits for every layer, then runs one graph); 'layers' "
                        "compiles the module after wrapping it (each layer waits on its own, between graphs)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (inductor, aot_eager, eager)")
    return p


def compile_model(args, model):
    return torch.compile(model, backend=args.compile_backend)


def check(args):
    if args.iterations < 1:
        sys.exit("--iterations must be >= 1, got %d" % args.iterations)
    if not 0 <= args.warmup < args.iterations:
        sys.exit("--warmup must be in [0, iterations), got %d" % args.warmup)
    if args.batch < 1:
        sys.exit("--batch must be >= 1, got %d" % args.batch)
    if args.threads < 1:
        sys.exit("--threads must be >= 1, got %d" % args.threads)
    if args.compile and not hasattr(torch, "compile"):
        sys.exit("--compile needs torch >= 2.0, this is torch %s" % torch.__version__)
    torch.set_num_threads(args.threads)


def rank_and_size():
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def make_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr or 0.01, momentum=args.momentum, nesterov=args.nesterov,
                               weight_decay=args.weight_decay)
    cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=args.lr or 1e-3, weight_decay=args.weight_decay)


def distribute(args, model):
    """Returns (model to call, optimizer, finish) for the chosen backend."""
    if args.backend == "autobyte":
        import autobyte.torch as ab
        ab.init()
        net = compile_model(args, model) if args.compile == "model" else model
        opt = ab.DistributedOptimizer(make_optimizer(args, model.parameters()), net)
        if args.compile == "layers":
            net = compile_model(args, model)
        return net, opt, lambda: (opt.synchronize(), opt.autobyte_report())[1]
    if args.backend == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        # broadcast_buffers=False: like autobyte, buffers are broadcast once
        # at start (DDP's constructor does), not before every forward.
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        return ddp, make_optimizer(args, ddp.parameters()), lambda: None
    return model, make_optimizer(args, model.parameters()), lambda: None


def train(args, model, batch_fn, loss_fn):
    """Runs the loop; prints the result JSON line on rank 0."""
    rank, world = rank_and_size()
    if args.save_init and rank == 0:
        torch.save(model.state_dict(), args.save_init)
    net, opt, finish = distribute(args, model)
    if args.compile and args.backend != "autobyte":
        net = compile_model(args, net)  # DDP: around its wrapper, as DDP's docs do
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    losses, times = [], []
    t0 = time.perf_counter()
    for _ in range(args.iterations):
        x, y = batch_fn(gen)
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    report = finish()
    steady = times[args.warmup:]
    result = {
        "backend": args.backend,
        "workers": world,
        "iterations": args.iterations,
        "iteration_time_s": sum(steady) / len(steady),
        "final_loss": losses[-1],
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "compile": args.compile,
    }
    if args.losses:
        result["losses"] = losses
    if report:
        result["tuner"], result["configs"] = report["tuner"], report["configs"]
    result["iteration_times_s"] = times
    if rank == 0:
        if args.save:
            torch.save(model.state_dict(), args.save)
        print(json.dumps(result), flush=True)
    if args.backend == "ddp":
        torch.distributed.destroy_process_group()
    return result
