"""Shared scaffolding of the PyTorch examples: flags, the two backends
(autobyte and torch DDP on gloo), timing and the result line."""

import argparse
import copy
import json
import os
import sys
import time

import torch


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", choices=["autobyte", "autobyte-ddp", "ddp", "local"], default="autobyte",
                   help="autobyte (the plugin's DistributedOptimizer), autobyte-ddp (the plugin's DistributedDataParallel "
                        "wrapper, DDP's interface), ddp (torch DistributedDataParallel on gloo) or local (one process, no "
                        "communication)")
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
    p.add_argument("--ddp-sum", default="gloo",
                   help="ddp: how the gradients are summed: gloo (DDP's own all-reduce), rank or ring (a DDP "
                        "communication hook gathers every rank's gradient and sums in the order of autobyte's parameter "
                        "servers, or of its ring under the launch's partition, so that the two can be compared bit for "
                        "bit), or bf16 / fp16 (DDP's own bf16_compress_hook / fp16_compress_hook: gloo's all-reduce in "
                        "16 bits, half the bytes). Several, comma-separated (gloo,rank,ring), train once each, one "
                        "after the other from the same initial state, printing a result line for each and saving "
                        "--save FILE as FILE.SUM")
    return p


def transformer_flags(p, vocab, dim, layers, heads, seq, batch, dropout_of=None, seq_help=None):
    """Adds the shape flags the transformer examples share, with the model's
    defaults; --dropout only for a model (named dropout_of) that has its own."""
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--seq", type=int, default=seq, help=seq_help or "tokens per sequence")
    if dropout_of:
        p.add_argument("--dropout", type=float, default=0.0,
                       help="%s's dropouts (its own default is 0.1; 0 keeps runs of different backends comparable)" % dropout_of)
    p.set_defaults(batch=batch)


def check_transformer(p, args, extra=()):
    """Refuses shapes no transformer has, naming the flag and its value:
    the common checks plus --vocab, --dim, --layers, --heads, --seq and the
    flags in extra >= 1, --dim a multiple of --heads, --dropout in [0, 1)."""
    check(args)
    for name in ("vocab", "dim", "layers", "heads", "seq") + tuple(extra):
        if getattr(args, name) < 1:
            p.error("--%s must be >= 1, got %d" % (name, getattr(args, name)))
    if args.dim % args.heads:
        p.error("--dim %d must be a multiple of --heads %d" % (args.dim, args.heads))
    if not 0 <= getattr(args, "dropout", 0) < 1:
        p.error("--dropout must be in [0, 1), got %g" % args.dropout)


def noisy_counting(gen, batch, length, n):
    """A batch of token sequences in [0, n) that follow a noisy "next =
    previous + 1" rule (one token in ten replaced at random), so there is
    something to learn."""
    start = torch.randint(0, n, (batch, 1), generator=gen)
    noise = (torch.rand(batch, length, generator=gen) < 0.1).long() * torch.randint(0, n, (batch, length), generator=gen)
    return (start + torch.arange(length).unsqueeze(0) + noise) % n


def image_label_flags(p):
    """--labels, for the examples that train on synthetic images."""
    p.add_argument("--labels", choices=["random", "templates"], default="random",
                   help="random: labels independent of the images (the loss stays near ln(classes); for timing); "
                        "templates: each image is noise plus 0.4 times a fixed random template of its class, which "
                        "the model learns within about a hundred steps, so the loss curve shows what a change of "
                        "arithmetic costs")


def image_batches(args, channels, size, classes):
    """batch(gen) for train(): args.batch images of channels x size x size
    with labels in [0, classes), labelled as --labels says. The templates
    come from a generator of their own, so every rank has the same ones and
    the model's initial weights do not depend on them."""
    templates = torch.randn(classes, channels, size, size, generator=torch.Generator().manual_seed(args.seed + 7919))

    def batch(gen):
        x = torch.randn(args.batch, channels, size, size, generator=gen)
        y = torch.randint(0, classes, (args.batch,), generator=gen)
        if args.labels == "templates":
            x = x + 0.4 * templates[y]
        return x, y
    return batch


def import_transformers():
    """Hugging Face transformers, offline: the examples build their models
    from a config, never a checkpoint, so nothing may reach the network (the
    variable is read when transformers is imported, hence before it). Current
    releases need torch >= 2.6, and 4.49 is the last that runs on torch 1.13
    (.ci/run installs it in a venv over Debian's torch)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    return transformers


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
    sums = args.ddp_sum.split(",")
    if not sums or any(m not in DDP_SUMS for m in sums) or len(set(sums)) < len(sums):
        sys.exit("--ddp-sum must be some of %s, comma-separated, got %r" % (", ".join(DDP_SUMS), args.ddp_sum))
    if len(sums) > 1 and args.backend != "ddp":
        sys.exit("--ddp-sum %s: several runs are for --backend ddp only" % args.ddp_sum)
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


# --ddp-sum: DDP's own all-reduce, or a communication hook that sums in the
# order of autobyte's parameter servers or of its ring (docs/runtime.md,
# "Summation order"), so that DDP and autobyte can be compared bit for bit.
DDP_SUMS = ("gloo", "rank", "ring", "bf16", "fp16")


def _gather(bucket):
    """Every rank's bucket, each divided by the number of ranks first (as
    autobyte divides before it sums). Every rank receives the N-1 other
    buckets, where an all-reduce moves 2(N-1)/N of one: these hooks are for
    comparisons, not for speed. Synchronous: on torch 1.13, a gloo future
    continued with then() left the process hanging at exit."""
    import torch.distributed as dist
    world = dist.get_world_size()
    t = bucket.buffer().div_(world)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    return parts


def _done(t):
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


def rank_order_hook(_, bucket):
    """The parameter servers' order: ((g0 + g1) + g2) + ..., element by
    element."""
    parts = _gather(bucket)
    for part in parts[1:]:
        parts[0].add_(part)
    return _done(parts[0])


def _near_equal(n, count, i):
    """[lo, hi) of part i of n elements cut into count near-equal parts, the
    larger first (sched.PieceBytes, allreduce's chunk)."""
    base, rem = divmod(n, count)
    lo = i * base + min(i, rem)
    return lo, lo + base + (1 if i < rem else 0)


def ring_order_hook(partition, bucket):
    """Autobyte's ring order. The plugin posts each parameter as one
    float32 tensor of numel + 1 elements (a flag last); the engine cuts a
    tensor larger than the partition into ceil(bytes / partition) near-equal
    pieces of whole elements, the ring cuts each piece into N near-equal
    chunks, and chunk c is summed along the ring from rank c:
    ((g_c + g_c+1) + ...) + g_c-1, ranks mod N."""
    parts = _gather(bucket)
    world = len(parts)
    out = torch.empty_like(parts[0])
    off = 0
    for p in bucket.parameters():
        m = p.numel()
        elems = m + 1
        size = 4 * elems
        count = 1 if partition <= 0 or size <= partition else min((size - 1) // partition + 1, elems)
        for i in range(count):
            plo, phi = _near_equal(elems, count, i)
            for c in range(world):
                lo, hi = _near_equal(phi - plo, world, c)
                lo, hi = off + plo + lo, off + min(plo + hi, m)  # the flag is not in the bucket
                if lo >= hi:
                    continue
                acc = parts[c][lo:hi].clone()
                for k in range(1, world):
                    acc.add_(parts[(c + k) % world][lo:hi])
                out[lo:hi] = acc
        off += m
    assert off == out.numel(), "the bucket is not its parameters end to end (%d of %d elements)" % (off, out.numel())
    return _done(out)


def distribute(args, model, ddp_sum="gloo"):
    """Returns (model to call, optimizer, finish) for the chosen backend."""
    if args.backend == "autobyte":
        import autobyte.torch as ab
        ab.init()
        net = compile_model(args, model) if args.compile == "model" else model
        opt = ab.DistributedOptimizer(make_optimizer(args, model.parameters()), net)
        if args.compile == "layers":
            net = compile_model(args, model)
        return net, opt, lambda: (opt.synchronize(), opt.autobyte_report())[1]
    if args.backend == "autobyte-ddp":
        import autobyte.torch as ab
        ab.init()
        net = ab.DistributedDataParallel(model, broadcast_buffers=False)
        return net, make_optimizer(args, net.parameters()), net.autobyte_report
    if args.backend == "ddp":
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        # gloo cannot broadcast bool buffers on torch 1.13 (transformers 4.x's
        # GPT-2 keeps its causal mask in one); they are constants that every
        # rank builds alike, so DDP leaves them out.
        masks = [n for n, b in model.named_buffers() if b.dtype == torch.bool]
        if masks:
            torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, masks)
        # broadcast_buffers=False: like autobyte, buffers are broadcast once
        # at start (DDP's constructor does), not before every forward.
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        if ddp_sum in ("bf16", "fp16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, getattr(default_hooks, ddp_sum + "_compress_hook"))
        elif ddp_sum == "rank":
            ddp.register_comm_hook(None, rank_order_hook)
        elif ddp_sum == "ring":
            # The partition autobyte would use under the same launch flags
            # (the launcher sets it for every script).
            partition = int(os.environ.get("AUTOBYTE_PARTITION") or 0)
            if partition <= 0:
                sys.exit("--ddp-sum ring needs AUTOBYTE_PARTITION (run it under autobyte launch --arch allreduce)")
            ddp.register_comm_hook(partition, ring_order_hook)
        return ddp, make_optimizer(args, ddp.parameters()), lambda: None
    return model, make_optimizer(args, model.parameters()), lambda: None


def thread_cpu():
    """(this thread's CPU seconds, the process's) where Linux's /proc says
    so, else (None, process). On the training thread, the difference is
    what the communication's threads (the engine's or gloo's) used."""
    total = time.process_time()
    try:
        with open("/proc/thread-self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), total
    except (OSError, ValueError, IndexError):
        return None, total


def train(args, model, batch_fn, loss_fn, extra=None):
    """Runs the loop; prints the result JSON line on rank 0, with extra's
    fields (e.g. which model) added. With --ddp-sum gloo,rank it runs once
    for each, each from the initial model and random state."""
    rank, world = rank_and_size()
    if args.save_init and rank == 0:
        torch.save(model.state_dict(), args.save_init)
    sums = args.ddp_sum.split(",")
    if len(sums) > 1:
        initial, rng = copy.deepcopy(model), torch.get_rng_state()
    for i, ddp_sum in enumerate(sums):
        if i:
            model = copy.deepcopy(initial)
            torch.set_rng_state(rng)
        save = args.save + "." + ddp_sum if args.save and len(sums) > 1 else args.save
        result = train_once(args, model, batch_fn, loss_fn, extra, ddp_sum, save)
    if args.backend == "ddp":
        # Every rank is past its last collective before any tears gloo down:
        # torch 2.x's gloo can abort a rank ("terminate called without an
        # active exception") whose peer destroyed the group first.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return result


def train_once(args, model, batch_fn, loss_fn, extra, ddp_sum, save):
    rank, world = rank_and_size()
    net, opt, finish = distribute(args, model, ddp_sum)
    if args.compile and args.backend != "autobyte":
        net = compile_model(args, net)  # DDP: around its wrapper, as DDP's docs do
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    losses, times = [], []
    t0 = time.perf_counter()
    cpu0 = thread_cpu()
    for i in range(args.iterations):
        if i == args.warmup:
            # CPU over the steady steps, of this (the training) thread and
            # of the whole process (the engine's or gloo's threads too): on
            # shared cores the step time follows what every process spends,
            # and the split says whose it is.
            cpu0 = thread_cpu()
        x, y = batch_fn(gen)
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    cpu1 = thread_cpu()
    report = finish()
    steady = times[args.warmup:]
    result = {
        "backend": args.backend,
        "workers": world,
        "iterations": args.iterations,
        "iteration_time_s": sum(steady) / len(steady),
        "cpu_per_step_s": (cpu1[1] - cpu0[1]) / len(steady),
        "final_loss": losses[-1],
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "compile": args.compile,
    }
    if args.backend == "ddp":
        result["ddp_sum"] = ddp_sum
    if cpu0[0] is not None and cpu1[0] is not None:
        result["training_thread_cpu_per_step_s"] = (cpu1[0] - cpu0[0]) / len(steady)
    result.update(extra or {})
    if args.losses:
        result["losses"] = losses
    if report:
        result["tuner"], result["configs"] = report["tuner"], report["configs"]
    result["iteration_times_s"] = times
    if rank == 0:
        if save:
            torch.save(model.state_dict(), save)
        print(json.dumps(result), flush=True)
    return result
