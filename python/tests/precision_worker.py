"""16-bit training runs for test_precision.py: 16-bit models, compressed
gradients, autocast and loss scaling, through autobyte or DDP on gloo.

One job runs every name in --runs in turn (a fresh model and optimizer each,
with autobyte one session after another, which ring all-reduce allows;
parameter servers leave with the first session, so a job on them runs one).
Rank R saves run NAME to OUT.NAME.rankR: its own losses, its parameters and
buffers before and after the broadcast ("local", "init"), the final ones
("state") and, for loss-scaling runs, what an inf/NaN check saw at the step
with the injected inf ("local_finite": this worker's own gradient;
"synced_finite": the synchronised one, which the scaler checks).

Every rank draws different initial weights (the broadcast must make them
rank 0's) and its own batches. The math of a run is in train_step and
Model, which test_precision.py also runs in one process to emulate the
parameter servers' arithmetic exactly.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# name -> model dtype, autobyte compression (None: AUTOBYTE_COMPRESSION from
# the launcher; DDP: the matching compress hook), autocast, loss scaling
# ("" none; "inf": rank 1's loss is scaled by inf at step INF_STEP;
# "skip": no inf, every worker skips that step's update), and whether rank
# 0's initial weights hold awkward values (the broadcast checks, 0 steps;
# fc1.weight's second element is -0.0 in each).
RUNS = {
    "f32": ("float32", "none", False, "", False),
    "env": ("float32", None, False, "", False),
    "f32-bf16": ("float32", "bf16", False, "", False),
    "f32-fp16": ("float32", "fp16", False, "", False),
    "bf16": ("bfloat16", "none", False, "", False),
    "fp16": ("float16", "none", False, "", False),
    "autocast": ("float32", "none", True, "", False),
    "bcast-f32": ("float32", "none", False, "", True),
    "bcast-f32-bf16": ("float32", "bf16", False, "", True),
    "bcast-f32-fp16": ("float32", "fp16", False, "", True),
    "bcast-bf16": ("bfloat16", "fp16", False, "", True),
    "bcast-fp16": ("float16", "bf16", False, "", True),
    "inf-none": ("float32", "none", False, "inf", False),
    "skip-none": ("float32", "none", False, "skip", False),
    "inf-bf16": ("float32", "bf16", False, "inf", False),
    "skip-bf16": ("float32", "bf16", False, "skip", False),
    "inf-fp16": ("float32", "fp16", False, "inf", False),
    "skip-fp16": ("float32", "fp16", False, "skip", False),
}
INF_STEP = 4
INF_RANK = 1


class Model(nn.Module):
    """Conv + tanh + two linear layers, and three buffers the broadcast
    carries (a float one the forward adds, an integer and a bool one nothing
    uses, like transformers' causal masks); make_model adds a float64 one."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.fc1 = nn.Linear(6 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, 5)
        self.register_buffer("offset", 0.1 * torch.randn(3, 1, 1))
        self.register_buffer("count", torch.randint(0, 1000, (2,)))
        self.register_buffer("mask", torch.rand(16) < 0.5)

    def forward(self, x):
        h = torch.tanh(self.conv(x + self.offset))
        return self.fc2(torch.tanh(self.fc1(h.flatten(1))))


def make_model(seed, rank, dtype, awkward=False):
    torch.manual_seed(seed + rank)
    m = Model().to(dtype)
    # A float64 buffer (a model's precise constants), which .to(dtype)
    # would have converted: the broadcast carries its bytes.
    m.register_buffer("precise", torch.randn(3, dtype=torch.float64))
    if awkward and rank == 0:
        with torch.no_grad():
            w = m.fc1.weight.view(-1)
            if dtype == torch.float32:
                # Not bfloat16 or float16 values: rounding any would show.
                vals = [1 + 2 ** -20, -0.0, 1e-40, 3e38, -1e-30, 70000.5]
            elif dtype == torch.bfloat16:
                vals = [2.0 ** -130, -0.0, 3e38, 1 + 2 ** -7]
            else:
                # float16's per-payload scale would push 2**-24 out of range
                # beside 40000: these go through the float32 broadcast.
                vals = [40000.0, -0.0, 2.0 ** -24, 6e-8, 65504.0]
            w[:len(vals)] = torch.tensor(vals, dtype=torch.float32).to(dtype)
            m.offset.view(-1)[0] = 1 + 2 ** -20 if dtype == torch.float32 else -0.0
            m.count[0] = 2 ** 62 + 1  # beyond float32's integers, and float64's
            m.precise[:] = torch.tensor([1 + 2 ** -52, -0.0, float("nan")], dtype=torch.float64)
    return m


def batches(seed, rank):
    return torch.Generator().manual_seed(seed * 1000 + rank)


def batch(gen, n):
    return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 5, (n,), generator=gen)


def loss_of(model, x, y, dtype, autocast):
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x.to(dtype))
    else:
        out = model(x.to(dtype))
    return nn.functional.cross_entropy(out.float(), y)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


class EmulatedScaler:
    """GradScaler's logic where torch has no CPU GradScaler (torch 1.13:
    torch.cuda.amp.GradScaler disables itself without CUDA): multiply the
    loss by a power of two, unscale the gradients, skip the step if any is
    inf or NaN and halve the scale."""

    def __init__(self, scale=2.0 ** 16):
        self.scale_ = scale
        self.found = False

    def scale(self, loss):
        return loss * self.scale_

    def step(self, optimizer):
        inv = torch.tensor(1.0 / self.scale_, dtype=torch.float32)
        self.found = False
        for g in optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self.found = self.found or not bool(torch.isfinite(p.grad).all())
                    p.grad.mul_(inv)
        if not self.found:
            optimizer.step()

    def update(self, new_scale=None):
        if new_scale is not None:
            self.scale_ = new_scale
        elif self.found:
            self.scale_ *= 0.5

    def get_scale(self):
        return self.scale_


def make_scaler():
    """torch.amp.GradScaler on the CPU where torch has it, else the emulation."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cpu"), "torch.amp.GradScaler"
    return EmulatedScaler(), "emulated"


def all_finite(params):
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["autobyte", "ddp"], required=True)
    p.add_argument("--runs", required=True)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    if a.backend == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    else:
        sys.path.insert(0, os.path.join(HERE, ".."))
        import autobyte.torch as ab
    for name in a.runs.split(","):
        dtype_name, compression, autocast, scaling, awkward = RUNS[name]
        dtype = DTYPES[dtype_name]
        model = make_model(a.seed, rank, dtype, awkward)
        local = {k: v.clone() for k, v in model.state_dict().items()}
        inner = make_optimizer(model)
        if a.backend == "ddp":
            # DDP broadcasts rank 0's parameters and buffers, but gloo on
            # torch 1.13 cannot carry bool ones: those go as uint8, by hand.
            masks = [n for n, b in model.named_buffers() if b.dtype == torch.bool]
            nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, masks)
            net = nn.parallel.DistributedDataParallel(model)
            for n in masks:
                b = model.get_buffer(n)
                wide = b.to(torch.uint8)
                dist.broadcast(wide, 0)
                b.copy_(wide.bool())
            if compression in ("bf16", "fp16"):
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                net.register_comm_hook(None, getattr(default_hooks, compression + "_compress_hook"))
            opt = inner
        else:
            if compression is not None:
                ab.init(compression=compression)
            net = model
            opt = ab.DistributedOptimizer(inner, model)
        init = {k: v.clone() for k, v in model.state_dict().items()}
        steps = 0 if awkward else a.iterations
        scaler, how = make_scaler() if scaling else (None, "")
        res = {"losses": [], "local": local, "init": init, "scaler": how}
        gen = batches(a.seed, rank)
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            x, y = batch(gen, a.batch)
            loss = loss_of(net, x, y, dtype, autocast)
            res["losses"].append(loss.item())
            if scaler is None:
                loss.backward()
                opt.step()
                continue
            scaled = scaler.scale(loss)
            if scaling == "inf" and step == INF_STEP and rank == INF_RANK:
                scaled = scaled * float("inf")
            scaled.backward()
            if step == INF_STEP:
                res["local_finite"] = all_finite(model.parameters())
            if a.backend == "autobyte":
                opt.sync_gradients()
            if step == INF_STEP:
                res["synced_finite"] = all_finite(model.parameters())
            if scaling == "skip" and step == INF_STEP:
                scaler.update(scaler.get_scale() * 0.5)  # what a found inf does to the scale
                continue
            scaler.step(opt)
            scaler.update()
        if a.backend == "autobyte":
            opt.synchronize()
        res["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        if scaler is not None:
            res["final_scale"] = float(scaler.get_scale())
        torch.save(res, "%s.%s.rank%d" % (a.out, name, rank))
        if a.backend == "autobyte":
            ab.shutdown()
    if a.backend == "ddp":
        # See dp_worker.py: gloo must not be left to interpreter exit.
        dist.barrier()
        dist.destroy_process_group()
    print("done", rank, flush=True)


if __name__ == "__main__":
    main()
