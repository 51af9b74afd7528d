"""Measure a PyTorch model's per-layer compute and write the profile JSON
that ``autobyte sim --profile`` reads (docs/models.md), so you can simulate
your own model on your own cluster.

    /usr/bin/python3 -m autobyte.profile examples/torch_cnn.py:profile_model --out cnn.json
    autobyte sim --profile cnn.json --workers 16 --bandwidth 10Gbps

The argument names a function, as FILE.py:FUNCTION or MODULE:FUNCTION, that
returns (model, example_batch) or (model, example_batch, loss_fn). The batch
is the model's argument: a tensor, a tuple or list of positional arguments,
or a dict of keyword arguments (Hugging Face models). The default loss is the
output's ``loss`` where it has one (a Hugging Face model given labels), else
the sum of the output's first tensor. Layers are the modules that own
trainable parameters, in model.modules() order, as the plugin numbers them.
A layer's forward time runs from its module's forward pre-hook to the next
layer's (so parameter-free modules after it, such as activations and
pooling, count with it); its backward time ends when autograd has
accumulated its gradients and starts when the previous layer's were. Times
are medians over --iterations after --warmup untimed steps. A layer that the
profiled step does not use (its parameters get no gradient) is kept with
zero compute time, since the plugin still synchronises it, and named on
stderr. The gradient's element size is the parameters' (2 for a model
converted to bfloat16 or float16).
"""

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback

import torch

from . import AutobyteError


def load_factory(spec):
    """Returns the function named by FILE.py:FUNCTION or MODULE:FUNCTION."""
    where, sep, func = spec.rpartition(":")
    if not sep or not where or not func:
        raise AutobyteError("autobyte.profile: %r: want FILE.py:FUNCTION or MODULE:FUNCTION" % spec)
    if where.endswith(".py"):
        if not os.path.exists(where):
            raise AutobyteError("autobyte.profile: %s does not exist" % where)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        mod_spec = importlib.util.spec_from_file_location("_autobyte_profiled", where)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    f = getattr(mod, func, None)
    if f is None or not callable(f):
        raise AutobyteError("autobyte.profile: %s has no function %r" % (where, func))
    return f


def _layers(model):
    layers, seen = [], set()
    for name, mod in model.named_modules():
        tensors = []
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            tensors.append((("%s.%s" % (name, pname)) if name else pname, p))
        if tensors:
            layers.append((name or type(mod).__name__, mod, tensors))
    return layers


def _first_tensor(x):
    """The first tensor in x (a tensor, a sequence, a mapping or an object
    with fields, such as Hugging Face's ModelOutput), or None."""
    if torch.is_tensor(x):
        return x
    if isinstance(x, dict):
        x = list(x.values())
    elif hasattr(x, "to_tuple"):
        x = x.to_tuple()
    elif hasattr(x, "__dict__") and not isinstance(x, torch.nn.Module):
        x = list(vars(x).values())
    if isinstance(x, (tuple, list)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def default_loss(out):
    """The output's loss where it carries one, else the sum of its first tensor."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if torch.is_tensor(loss):
        return loss
    t = _first_tensor(out)
    if t is None:
        raise AutobyteError("autobyte.profile: the model's output (%s) holds no tensor to take a loss of; return a loss_fn "
                            "as the factory's third value" % type(out).__name__)
    return t.float().sum()


def bytes_per_param(params):
    """The gradient element size of params, and the dtypes if they differ."""
    sizes = {p.element_size() for p in params}
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    return max(sizes), (dtypes if len(sizes) > 1 else None)


def profile(model, batch, loss_fn=None, iterations=10, warmup=3, name="model", warn=None):
    """Times model's layers; returns the profile as a dict."""
    if iterations < 1 or warmup < 0:
        raise AutobyteError("autobyte.profile: iterations must be >= 1 and warmup >= 0, got %d and %d" % (iterations, warmup))
    layers = _layers(model)
    if not layers:
        raise AutobyteError("autobyte.profile: the model has no trainable parameters")
    loss_fn = loss_fn or default_loss
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    fwd_start = [0.0] * len(layers)  # filled per step from the probes
    grad_ready = [0.0] * len(layers)
    pending = [0] * len(layers)
    hooks, accs = [], []

    def ready(i):
        def hook(*_):
            pending[i] -= 1
            if pending[i] == 0:
                grad_ready[i] = time.perf_counter()
        return hook

    # Every module's start time: a layer whose module is never called (its
    # parameters are used by an ancestor, e.g. MultiheadAttention's
    # out_proj) starts with its nearest ancestor that was.
    started = {}
    parent = {}
    for m in model.modules():
        for c in m.children():
            parent.setdefault(id(c), m)

    def probe(m, _):
        started[id(m)] = time.perf_counter()

    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(probe))
    for i, (_, mod, tensors) in enumerate(layers):
        for _, p in tensors:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            accs.append(acc)
            hooks.append(acc.register_hook(ready(i)))
    fwd = [[] for _ in layers]
    bwd = [[] for _ in layers]
    args, kwargs = (), {}
    if isinstance(batch, dict):
        kwargs = batch
    elif isinstance(batch, (tuple, list)):
        args = tuple(batch)
    else:
        args = (batch,)
    unused = set()
    try:
        for it in range(warmup + iterations):
            model.zero_grad(set_to_none=True)
            for i, (_, _, tensors) in enumerate(layers):
                pending[i] = len(tensors)
                grad_ready[i] = 0.0
            started.clear()
            try:
                loss = loss_fn(model(*args, **kwargs))
                t1 = time.perf_counter()
                loss.backward()
            except AutobyteError:
                raise
            except Exception as e:
                raise AutobyteError("autobyte.profile: a training step of the %s on the example batch failed: %s: %s"
                                    % (type(model).__name__, type(e).__name__, e)) from e
            t2 = time.perf_counter()
            if it < warmup:
                continue
            used = []
            for i, (_, mod, _) in enumerate(layers):
                m = mod
                while m is not None and id(m) not in started:
                    m = parent.get(id(m))
                if m is None or grad_ready[i] == 0.0:
                    unused.add(i)  # no compute of its own in this step
                    continue
                fwd_start[i] = started[id(m)]
                used.append(i)
            if not used:
                raise AutobyteError("autobyte.profile: no layer of the %s got a gradient from the loss" % type(model).__name__)
            for i in unused:
                fwd[i].append(0.0)
                bwd[i].append(0.0)
            order = sorted(used, key=lambda i: fwd_start[i])
            for j, i in enumerate(order):
                end = fwd_start[order[j + 1]] if j + 1 < len(order) else t1
                fwd[i].append(end - fwd_start[i])
            by_ready = sorted(used, key=lambda i: grad_ready[i])
            prev = t1
            for i in by_ready:
                bwd[i].append(grad_ready[i] - prev)
                prev = grad_ready[i]
            # Whatever autograd does after the last gradient (rare) counts
            # with the layer that finished last.
            bwd[by_ready[-1]][-1] += t2 - prev
    finally:
        for h in hooks:
            h.remove()
    if unused:
        warn("autobyte.profile: %d layer(s) got no gradient in the profiled step and are kept with zero compute time "
             "(the plugin still synchronises them): %s" % (len(unused), ", ".join(layers[i][0] for i in sorted(unused))))
    size, mixed = bytes_per_param([p for _, _, tensors in layers for _, p in tensors])
    if mixed:
        warn("autobyte.profile: the parameters have several dtypes (%s); every gradient is counted at %d bytes per "
             "element, the largest" % (", ".join(mixed), size))
    first = _first_tensor(batch)
    batch_size = first.shape[0] if first is not None and first.dim() else 1
    return {
        "name": name,
        "batch_size": int(batch_size),
        "device": "cpu, torch %s, %d threads" % (torch.__version__, torch.get_num_threads()),
        "bytes_per_param": size,
        "layers": [
            {"name": lname, "forward_s": statistics.median(fwd[i]), "backward_s": statistics.median(bwd[i]),
             "tensors": [{"name": tname, "params": p.numel()} for tname, p in tensors]}
            for i, (lname, _, tensors) in enumerate(layers)
        ],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m autobyte.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("factory", help="FILE.py:FUNCTION or MODULE:FUNCTION returning (model, batch[, loss_fn])")
    ap.add_argument("--out", default="-", help="profile JSON file ('-' = stdout)")
    ap.add_argument("--name", default="", help="profile name (default: the function's name)")
    ap.add_argument("--iterations", type=int, default=10, help="timed steps (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    a = ap.parse_args(argv)
    try:
        if a.threads < 0:
            raise AutobyteError("autobyte.profile: --threads must be >= 0, got %d" % a.threads)
        if a.threads:
            torch.set_num_threads(a.threads)
        factory = load_factory(a.factory)
        got = factory()
        if not isinstance(got, tuple) or len(got) not in (2, 3):
            raise AutobyteError("autobyte.profile: %s must return (model, batch) or (model, batch, loss_fn), got %s" % (a.factory, type(got).__name__))
        model, batch = got[0], got[1]
        loss_fn = got[2] if len(got) == 3 else None
        prof = profile(model, batch, loss_fn, a.iterations, a.warmup, a.name or a.factory.rpartition(":")[2])
    except AutobyteError as e:
        if e.__cause__ is not None:  # the user's model failed: where, then what
            traceback.print_exception(type(e.__cause__), e.__cause__, e.__cause__.__traceback__, file=sys.stderr)
        print(e, file=sys.stderr)
        return 2
    text = json.dumps(prof, indent=1)
    if a.out == "-":
        print(text)
    else:
        with open(a.out + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(a.out + ".tmp", a.out)
        total = sum(l["forward_s"] + l["backward_s"] for l in prof["layers"])
        print("autobyte.profile: %d layers, %d parameters, %.1f ms forward+backward per step -> %s" % (
            len(prof["layers"]), sum(t["params"] for l in prof["layers"] for t in l["tensors"]), total * 1e3, a.out),
            file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
