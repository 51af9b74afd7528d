"""The PyTorch plugin: data-parallel training through the autobyte engine.

Two added lines turn a single-process training script into a data-parallel
one (start it with ``autobyte launch --workers N -- /usr/bin/python3 train.py``
or torchrun)::

    import autobyte.torch as ab
    ab.init()
    ...
    optimizer = ab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    for x, y in data:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    optimizer.synchronize()   # before reading the parameters after the last step

How it works (ByteScheduler's design, the paper's "cross the barrier"):

* Each trainable parameter is one tensor of the engine; the parameters of one
  module form one layer, numbered in ``model.modules()`` order (the forward
  order of ``nn.Sequential``-style models), and lower layers go first.
* When autograd has accumulated a parameter's gradient, a hook copies it
  (the one copy on the way in) into a buffer the engine owns for the
  iteration, and posts it; the engine partitions it, schedules the pieces by
  layer under the credit window, and writes the sum over all workers back
  into the same buffer (no copy on the way out).
* ``optimizer.step()`` does not wait. A forward pre-hook on each module waits
  for that module's own parameters only, divides their sums by the number of
  workers and applies the optimizer's update to them alone, so the next
  forward pass starts while later layers are still being synchronised.
* At start, rank 0's parameters and buffers are broadcast to every worker.

The update is the wrapped optimizer's own code (one instance per parameter,
sharing the optimizer's state and hyper-parameters as they were when step()
was called), so SGD (momentum, Nesterov, weight decay), Adam and AdamW give
the same numbers as on one process with the averaged gradient.
"""

import atexit
import os
import sys
import threading
import types
import weakref

import torch

from . import AutobyteError
from ._native import Engine, library_path
from .timeline import Timeline, now

__all__ = ["init", "rank", "size", "DistributedOptimizer", "shutdown", "AutobyteError"]

SUPPORTED_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)

_settings = {}
_initialised = False
_sessions = []  # weak references to live _Session objects


def _env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise AutobyteError("autobyte: environment %s=%r is not an integer" % (name, v)) from None
    if n < 0:
        raise AutobyteError("autobyte: environment %s=%r is negative" % (name, v))
    return n


def init(**settings):
    """Prepares this process: checks RANK and WORLD_SIZE, loads (or builds)
    the engine. Keyword settings override the AUTOBYTE_* environment, e.g.
    ``init(partition="1MB", credit="4MB", scheduler="bytescheduler")``;
    names are arch, servers, scheduler, partition, credit, shard,
    bandwidth, peer_timeout, log_level, and trace (a file for this
    worker's timeline, see autobyte.timeline)."""
    global _initialised
    known = {"arch", "servers", "scheduler", "partition", "credit", "shard", "ps_pull", "bandwidth",
             "peer_timeout", "log_level", "listen", "trace"}
    for k, v in settings.items():
        if k not in known:
            raise AutobyteError("autobyte.init: unknown setting %r (known: %s)" % (k, ", ".join(sorted(known))))
        _settings["AUTOBYTE_" + k.upper()] = str(v)
    r, n = rank(), size()
    if r >= n:
        raise AutobyteError("autobyte: RANK=%d is out of range for WORLD_SIZE=%d" % (r, n))
    library_path()
    _initialised = True


def rank():
    """This worker's rank ($RANK, default 0)."""
    return _env_int("RANK", 0)


def size():
    """The number of workers ($WORLD_SIZE, default 1)."""
    return _env_int("WORLD_SIZE", 1)


def shutdown(ok=True):
    """Applies every outstanding update and leaves the job (also done at exit)."""
    for ref in list(_sessions):
        s = ref()
        if s is not None:
            s.close(ok)


_failed = False
_prev_excepthook = sys.excepthook


def _excepthook(tp, value, tb):
    global _failed
    _failed = True
    _prev_excepthook(tp, value, tb)


sys.excepthook = _excepthook


@atexit.register
def _at_exit():
    for ref in list(_sessions):
        s = ref()
        if s is None:
            continue
        try:
            s.close(not _failed, "its training script raised an exception" if _failed else None)
        except AutobyteError as e:
            print(e, file=sys.stderr)


# Buffers and non-trainable parameters are broadcast exactly through float32
# sums (rank 0's values plus zeros), which holds for these dtypes and for
# integers up to 2**24.
_EXACT_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def _check_broadcastable(name, t):
    if t.device.type != "cpu":
        raise AutobyteError("autobyte: %s is on device %s; only CPU tensors are supported" % (name, t.device))
    if t.is_sparse:
        raise AutobyteError("autobyte: %s is a sparse tensor; only dense tensors are supported" % name)
    if t.dtype in _EXACT_FLOATS:
        return
    if t.dtype in _INTS:
        if t.numel() and t.abs().max().item() > 2 ** 24:
            raise AutobyteError("autobyte: %s holds integers above 2**24, which the float32 broadcast cannot carry exactly" % name)
        return
    raise AutobyteError("autobyte: %s has dtype %s; autobyte synchronises float32 parameters and broadcasts float32/16, bfloat16 and integer state" % (name, t.dtype))


class _Session:
    """One model and optimizer bound to one engine session."""

    def __init__(self, optimizer, model, broadcast):
        self.world = size()
        self.me = rank()
        self.lock = threading.RLock()
        in_opt = {}
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                in_opt[id(p)] = gi
        names = {}
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                if id(p) not in names:
                    raise AutobyteError("autobyte: the optimizer's parameter group %d holds a %s tensor that is not a parameter of the model" % (gi, tuple(p.shape)))

        # Layers: modules in registration order that own trainable parameters
        # the optimizer updates; a parameter shared by several modules
        # belongs to the first.
        self.params, self.layer_of, self.group_of, self.names = [], [], [], []
        self.layer_params = []  # layer -> tensor ids
        self.module_layer = {}  # id(module) -> layer
        seen = set()
        for mod in model.modules():
            ids = []
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad or id(p) not in in_opt:
                    continue
                seen.add(id(p))
                if p.device.type != "cpu":
                    raise AutobyteError("autobyte: parameter %s is on device %s; the engine reads gradients from CPU memory, so train on the CPU (GPU tensors are not supported yet)" % (names[id(p)], p.device))
                if p.dtype != torch.float32:
                    raise AutobyteError("autobyte: parameter %s has dtype %s; only float32 parameters can be trained (convert the model with .float())" % (names[id(p)], p.dtype))
                if p.is_sparse:
                    raise AutobyteError("autobyte: parameter %s is sparse; only dense parameters are supported" % names[id(p)])
                ids.append(len(self.params))
                self.params.append(p)
                self.names.append(names[id(p)])
                self.group_of.append(in_opt[id(p)])
            if ids:
                layer = len(self.layer_params)
                self.layer_params.append(ids)
                self.module_layer[id(mod)] = layer
                for t in ids:
                    self.layer_of.append(layer)
        if not self.params:
            raise AutobyteError("autobyte: the model has no trainable float32 parameters in the optimizer; nothing to synchronise")
        trainable = set(id(p) for p in self.params)
        # Everything else rank 0 owns: frozen parameters, parameters the
        # optimizer does not update, buffers.
        self.state = []
        for n, p in model.named_parameters():
            if id(p) not in trainable:
                self.state.append(("parameter " + n, p))
        for n, b in model.named_buffers():
            self.state.append(("buffer " + n, b))
        for n, t in self.state:
            _check_broadcastable(n, t)
        state_elems = sum(t.numel() for _, t in self.state)

        tensors = [{"name": self.names[t], "layer": self.layer_of[t], "elems": self.params[t].numel()}
                   for t in range(len(self.params))]
        self.state_tensor = None
        if state_elems:
            self.state_tensor = len(tensors)
            tensors.append({"name": "(broadcast state)", "layer": len(self.layer_params), "elems": state_elems})
        # The engine reads AUTOBYTE_TRACE too, and writes engine-NAME beside it.
        trace = _settings.get("AUTOBYTE_TRACE") or os.environ.get("AUTOBYTE_TRACE")
        self.timeline = Timeline(trace, self.me) if trace else None
        try:
            self.engine = Engine(tensors, dict(_settings))
        except BaseException:
            if self.timeline is not None:
                self.timeline.close()
            raise

        # Per parameter: the engine's buffer, and an optimizer instance of the
        # same class over that parameter alone, sharing the state.
        self.buf = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.opt = optimizer
        self.sub = []
        for t, p in enumerate(self.params):
            g = optimizer.param_groups[self.group_of[t]]
            sub = type(optimizer)([p], **{k: v for k, v in g.items() if k != "params"})
            sub.state = optimizer.state
            self.sub.append(sub)
        self.iteration = 0  # training iterations stepped so far
        self.posted = [-1] * len(self.params)  # last iteration each tensor was posted for
        self.applied = [-1] * len(self.layer_params)  # last iteration applied per layer
        self.hyper = {}  # iteration -> per-group hyper-parameters at step()
        self.callback_queued = False
        self.closed = False

        if broadcast:
            self._broadcast()
        self.hooks = []
        self.accumulators = []
        for t, p in enumerate(self.params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self.hooks.append(acc.register_hook(self._grad_hook(t)))
            self.accumulators.append(acc)  # the hook lives as long as its node
        for mod in model.modules():
            if id(mod) in self.module_layer:
                self.hooks.append(mod.register_forward_pre_hook(self._pre_forward([self.module_layer[id(mod)]])))
        # Some modules' parameters are used without calling the module (e.g.
        # MultiheadAttention reads out_proj.weight itself). The first forward
        # pass records which modules run; at the first step, each layer whose
        # module did not run is applied by its nearest ancestor that did.
        self.forward_began = self.backward_began = None
        if self.engine.tuning or self.timeline is not None:
            # Rank 0 tunes (the engine measures the steps' compute), or the
            # timeline records the forward passes.
            self.hooks.append(model.register_forward_pre_hook(self._mark_forward_begin))
            self.hooks.append(model.register_forward_hook(self._mark_forward_end))
        self.forward_marked = -1
        self.model = model
        self.ran = set()
        self.probes = [m.register_forward_pre_hook(self._probe) for m in model.modules()]

    # Engine iteration 0 is the broadcast; training iteration k is k + 1.
    @staticmethod
    def _engine_iter(k):
        return k + 1

    def _broadcast(self):
        with torch.no_grad():
            for t, p in enumerate(self.params):
                b = self.buf[t]
                if self.me == 0:
                    b.copy_(p)
                else:
                    b.zero_()
                self.engine.post(t, 0, b.data_ptr(), b.numel())
            flat = None
            if self.state_tensor is not None:
                flat = torch.zeros(sum(x.numel() for _, x in self.state), dtype=torch.float32)
                if self.me == 0:
                    off = 0
                    for _, x in self.state:
                        flat[off:off + x.numel()].copy_(x.reshape(-1).to(torch.float32))
                        off += x.numel()
                self.engine.post(self.state_tensor, 0, flat.data_ptr(), flat.numel())
            for layer in range(len(self.layer_params) + (1 if flat is not None else 0)):
                self.engine.wait_layer(layer, 0)
            for t, p in enumerate(self.params):
                p.copy_(self.buf[t])
            if flat is not None:
                off = 0
                for _, x in self.state:
                    x.copy_(flat[off:off + x.numel()].reshape(x.shape).to(x.dtype))
                    off += x.numel()

    def _grad_hook(self, t):
        def hook(*_):
            self._post(t, from_backward=True)
        return hook

    def _post(self, t, from_backward):
        with self.lock:
            if self.closed:
                raise AutobyteError("autobyte: gradient of %s computed after the optimizer was shut down" % self.names[t])
            k = self.iteration
            if self.posted[t] == k:
                raise AutobyteError(
                    "autobyte: the gradient of %s was computed twice in iteration %d; call optimizer.step() after "
                    "each backward pass (accumulating gradients over several backward passes is not supported)" % (self.names[t], k))
            # The buffer may still hold the previous iteration's sum if the
            # parameter's module did not run in this forward pass.
            self._apply(self.layer_of[t], k - 1)
            p, b = self.params[t], self.buf[t]
            with torch.no_grad():
                if from_backward and p.grad is not None:
                    if p.grad.is_sparse:
                        raise AutobyteError("autobyte: parameter %s has a sparse gradient; only dense gradients are supported" % self.names[t])
                    # Averaged before summing, as DDP does, so the two
                    # round alike; this is the one copy on the way in.
                    torch.div(p.grad, self.world, out=b)
                else:
                    b.zero_()  # unused in this step: contributes nothing
            self.engine.post(t, self._engine_iter(k), b.data_ptr(), b.numel())
            self.posted[t] = k
            if self.timeline is not None:
                t_post = now()
                if from_backward and self.backward_began is None:
                    self.backward_began = t_post
                self.timeline.instant("post", "post", t_post, step=k, layer=self.layer_of[t], tensor=self.names[t])
            if from_backward and not self.callback_queued:
                self.callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self):
        # Parameters the backward pass did not reach (unused in this step)
        # contribute zeros, so every worker posts every tensor.
        with self.lock:
            self.callback_queued = False
            for t in range(len(self.params)):
                if self.posted[t] != self.iteration:
                    self._post(t, from_backward=False)
            if self.engine.tuning and self.forward_marked == self.iteration:
                self.engine.mark(Engine.BACKWARD_END, self._engine_iter(self.iteration))
            if self.timeline is not None and self.backward_began is not None:
                self.timeline.span("backward", "compute", self.backward_began, now(), step=self.iteration)
                self.backward_began = None

    def _pre_forward(self, layers):
        def hook(*_):
            k = self.iteration - 1
            for layer in layers:
                if self.applied[layer] < k:
                    with self.lock:
                        self._apply(layer, k)
        return hook

    def _mark_forward_begin(self, *_):
        if self.forward_marked != self.iteration:
            if self.timeline is not None:
                self.forward_began = now()
            if self.engine.tuning:
                self.engine.mark(Engine.FORWARD_BEGIN, self._engine_iter(self.iteration))

    def _mark_forward_end(self, *_):
        # Only the first forward of a step counts (and runs the tuner, which
        # may change the configuration from a later iteration).
        if self.forward_marked != self.iteration:
            self.forward_marked = self.iteration
            if self.timeline is not None and self.forward_began is not None:
                self.timeline.span("forward", "compute", self.forward_began, now(), step=self.iteration)
            if self.engine.tuning:
                self.engine.mark(Engine.FORWARD_END, self._engine_iter(self.iteration))

    def report(self):
        """The tuner and the configurations applied, each from the training
        step it applied to first."""
        r = self.engine.report()
        for c in r["configs"]:
            c["from_step"] = max(0, c.pop("from_iteration") - 1)
        return r

    def _probe(self, module, _):
        self.ran.add(id(module))

    def _delegate_silent_layers(self):
        for h in self.probes:
            h.remove()
        self.probes = []
        if not self.ran:
            return  # no forward pass before the first step
        parent = {}
        for m in self.model.modules():
            for c in m.children():
                parent.setdefault(id(c), m)
        by_id = {id(m): m for m in self.model.modules()}
        extra = {}
        for mid, layer in self.module_layer.items():
            if mid in self.ran:
                continue
            m = parent.get(mid)
            while m is not None and id(m) not in self.ran:
                m = parent.get(id(m))
            if m is None:
                m = self.model
            extra.setdefault(id(m), []).append(layer)
        for mid, layers in extra.items():
            self.hooks.append(by_id[mid].register_forward_pre_hook(self._pre_forward(layers)))

    def _apply(self, layer, k):
        """Waits for layer's sums of iteration k and applies the update."""
        if k < 0 or self.applied[layer] >= k:
            return
        t0 = now()
        self.engine.wait_layer(layer, self._engine_iter(k))
        if self.timeline is not None:
            # The forward of step k+1 waits for the sums of step k.
            self.timeline.span("wait layer %d" % layer, "wait", t0, now(), layer=layer, step=k + 1)
        hyper = self.hyper[k]
        with torch.no_grad():
            for t in self.layer_params[layer]:
                p, b = self.params[t], self.buf[t]
                sub = self.sub[t]
                sub.param_groups[0].update(hyper[self.group_of[t]])
                saved = p.grad
                p.grad = b
                try:
                    sub.step()
                finally:
                    p.grad = saved
        self.applied[layer] = k
        if all(a >= k for a in self.applied):
            self.hyper.pop(k, None)

    def step(self, closure=None):
        if closure is not None:
            raise AutobyteError("autobyte: optimizer.step(closure) is not supported (the update is applied later, layer by layer)")
        with self.lock:
            if self.closed:
                raise AutobyteError("autobyte: optimizer.step() after shutdown")
            k = self.iteration
            for t in range(len(self.params)):
                if self.posted[t] != k:
                    self._post(t, from_backward=False)
            self.hyper[k] = [{key: v for key, v in g.items() if key != "params"} for g in self.opt.param_groups]
            if self.probes:
                self._delegate_silent_layers()
            self.iteration = k + 1

    def synchronize(self):
        with self.lock:
            for layer in range(len(self.layer_params)):
                self._apply(layer, self.iteration - 1)

    def close(self, ok=True, reason=None):
        with self.lock:
            if self.closed:
                return
            try:
                if ok:
                    self.synchronize()
            finally:
                self.closed = True
                for h in self.hooks + self.probes:
                    h.remove()
                if self.timeline is not None:
                    self.timeline.close()
                self.engine.close(ok, reason)


def DistributedOptimizer(optimizer, model, broadcast=True):
    """Makes optimizer data-parallel over the job's workers and returns it.

    The same object is returned (so learning-rate schedulers keep working),
    with step() and state_dict() bound to the engine and two methods added:
    synchronize() and autobyte_report(); zero_grad() is the optimizer's own. Rank 0's parameters and buffers are broadcast first (unless
    broadcast=False). Supported: torch.optim.SGD, Adam and AdamW."""
    if type(optimizer) not in SUPPORTED_OPTIMIZERS:
        raise AutobyteError("autobyte: %s is not supported; use torch.optim.SGD, Adam or AdamW (each parameter's update is applied on its own as soon as its gradient is synchronised)" % type(optimizer).__name__)
    if not isinstance(model, torch.nn.Module):
        raise AutobyteError("autobyte: DistributedOptimizer needs the model (a torch.nn.Module), got %s" % type(model).__name__)
    if getattr(optimizer, "_autobyte", None) is not None:
        raise AutobyteError("autobyte: this optimizer is already distributed")
    if not _initialised:
        init()
    s = _Session(optimizer, model, broadcast)
    _sessions.append(weakref.ref(s))
    optimizer._autobyte = s
    state_dict = optimizer.state_dict

    # Bound to the optimizer itself (not the session): learning-rate
    # schedulers wrap optimizer.step and count calls on its __self__.
    def step(self, closure=None):
        return self._autobyte.step(closure)

    def synchronize(self):
        self._autobyte.synchronize()

    def autobyte_report(self):
        return self._autobyte.report()

    def synced_state_dict(self):
        self._autobyte.synchronize()
        return state_dict()

    optimizer.step = types.MethodType(step, optimizer)
    optimizer.synchronize = types.MethodType(synchronize, optimizer)
    optimizer.autobyte_report = types.MethodType(autobyte_report, optimizer)
    optimizer.state_dict = types.MethodType(synced_state_dict, optimizer)
    return optimizer
