"""One model and optimizer bound to one session of the Go engine.

Per training step k (engine iteration k + 1; iteration 0 is the broadcast):

* each parameter's gradient, once autograd has accumulated it in the pass
  that synchronises, is divided by the number of workers into a buffer the
  engine owns (the one copy on the way in) and posted; the engine writes the
  sum over all workers back into the same buffer;
* step() records the hyper-parameters in force and returns;
* in the next forward, each module's pre-hook waits for its own layer's sums
  and applies the optimizer's update to that layer alone.

Each buffer has one element more than its parameter: 1 where the worker had
a gradient for it, else 0. Their sum says whether any worker had one; where
none had, the update leaves the parameter alone, as torch does for a
parameter whose .grad is None (and as DDP does for one unused everywhere).
The buffers are float32 whatever the parameter's type; on a 16-bit wire the
flags' sums (small integers) stay exact: bfloat16 holds integers up to 256
exactly, and float16's per-payload power-of-two scale only moves a flag's
exponent (it would flush to zero only beside a value of 2**39 or more in the
same payload).

16-bit parameters: the gradient is copied into the float32 buffer exactly
(and divided by the number of workers there); the engine rounds it to the
parameter's own type on the wire, so the sum it writes back is a value of
that type, and the update is given it converted back (exact; for float16,
exact within float16's range, as any float16 sum would be).

sync_gradients() is the other way to finish a step: it waits for all of
this step's sums and puts them, averaged, in every parameter's .grad, so
that a GradScaler's inf/NaN check (or gradient clipping) sees the same
synchronised gradient on every worker; the next step() then applies the
whole update at once from .grad, and a step() the scaler skips is skipped
on every worker alike.

Without an optimizer (DistributedDataParallel, ddp.py) the session
synchronises every trainable parameter of the model and ends each
synchronising backward pass the way sync_gradients() does: the sums,
averaged, are in .grad when backward returns, as under DDP, and the
caller's own optimizer updates the parameters. Its join() (uneven inputs)
cannot replay that update on a joined worker, so it ends as DDP's does: one
more step hands every worker the parameters of the last worker to train
(_parameters_from).

A sparse embedding's gradient (nn.Embedding(sparse=True)) travels dense and
comes back sparse (Layout.sparse_grad, _grad_of), as DDP hands it back.
"""

import contextlib
import ctypes
import os
import threading
import types
import warnings

import torch

from .. import AutobyteError
from .._native import Engine
from ..timeline import Timeline, now
from . import hooks
from .join import JoinCodec
from .layout import Layout, compression_setting, decode_state, encode_state, state_elems, wire_of_compression
from .optim import LayerUpdates, hyper_parameters


def _sync_batchnorm_runs_alone():
    """Whether torch's SyncBatchNorm, in training, runs on a CPU batch as
    plain BatchNorm, without a word (torch 2 without a process group);
    torch 1.13, or torch 2 with a process group, refuses the CPU input
    itself, and says so."""
    try:
        torch.nn.SyncBatchNorm(1).train()(torch.zeros(2, 1, 1))
        return True
    except (ValueError, RuntimeError):
        return False


def _gradients_of(model):
    """What stands for the optimizer of DistributedDataParallel's session
    (which leaves the update to the script): one group of the model's
    trainable parameters."""
    return types.SimpleNamespace(param_groups=[{"params": [p for p in model.parameters() if p.requires_grad]}])


def check_wrappable(model, settings):
    """Raises what opening DistributedDataParallel's session over model
    would raise about the model itself (its parameters and buffers),
    without opening anything."""
    inner = hooks.compiled_inner(model)
    model = inner if inner is not None else model
    Layout(model, _gradients_of(model), wire_of_compression(*compression_setting(settings)))


class Session:
    def __init__(self, optimizer, model, settings, rank, world, broadcast=True, backward_passes_per_step=1,
                 uneven_inputs=False, marked=None):
        self.world, self.me = world, rank
        self.lock = threading.RLock()
        # torch.compile(model) handed in: the layers are the wrapped
        # module's, and the whole forward waits for every layer before the
        # compiled graph runs (hooks inside it would break the graph at each
        # layer). A module compiled after wrapping keeps its per-layer waits,
        # which torch.compile runs eagerly between graphs.
        inner = hooks.compiled_inner(model)
        outer, model = model, inner if inner is not None else model
        # No optimizer: DistributedDataParallel (see the module's comment).
        self.grad_mode = optimizer is None
        if self.grad_mode:
            optimizer = _gradients_of(model)
        self.opt, self.model = optimizer, model
        self.passes_per_step = backward_passes_per_step
        L = self.layout = Layout(model, optimizer, wire_of_compression(*compression_setting(settings)))
        self.params, self.names = L.params, L.names
        if L.outside_opt:
            shown = ", ".join(L.outside_opt[:3]) + (", ..." if len(L.outside_opt) > 3 else "")
            warnings.warn(
                "autobyte: %d trainable parameters of the model are not in the optimizer (%s): they are broadcast from "
                "rank 0 once and never synchronised, so another optimizer training them would let the workers drift "
                "apart; freeze them (requires_grad_(False)) or put them in the distributed optimizer"
                % (len(L.outside_opt), shown), stacklevel=3)
        synced_bn = [n for n, m in model.named_modules() if isinstance(m, torch.nn.SyncBatchNorm)]
        if synced_bn and _sync_batchnorm_runs_alone():
            warnings.warn(
                "autobyte: SyncBatchNorm layers (%s) do not synchronise here: torch synchronises them on GPUs "
                "through a process group, and on the CPU without one runs them as BatchNorm, so each worker "
                "normalises with its own batch's statistics (the gradients are still averaged over the workers)"
                % (", ".join(synced_bn[:3]) + (", ... (%d in all)" % len(synced_bn) if len(synced_bn) > 3 else "")),
                stacklevel=3)
        # Before the engine: nothing to close if it fails.
        self.updates = None if self.grad_mode else LayerUpdates(optimizer, L)
        self.join = JoinCodec(optimizer, world) if uneven_inputs else None

        # The engine reads AUTOBYTE_TRACE too, and writes engine-NAME beside it.
        trace = settings.get("AUTOBYTE_TRACE") or os.environ.get("AUTOBYTE_TRACE")
        self.timeline = Timeline(trace, self.me) if trace else None
        try:
            self.engine = Engine(L.engine_tensors(extra=1, join_elems=self.join.elems if self.join else 0),
                                 dict(settings))
        except BaseException:
            if self.timeline is not None:
                self.timeline.close()
            raise
        self.hooks, self.probes = [], []
        try:
            self._start(L, model, outer if marked is None else marked, inner, broadcast)
        except BaseException as e:
            # Nothing half-open stays behind: the process can open the next
            # session (and the peers hear why this one ended).
            for h in self.hooks + self.probes:
                h.remove()
            if self.timeline is not None:
                self.timeline.close()
            try:
                self.engine.close(False, "worker %d: setting up the session failed: %s" % (rank, e))
            except AutobyteError:
                pass  # the engine had stopped already; the first error is e
            raise

    def _start(self, L, model, marked, inner, broadcast):
        self.state_tensor = L.state_tensor

        self.flat = [torch.empty(p.numel() + 1, dtype=torch.float32) for p in self.params]
        self.buf = [f[:-1].view(p.shape) for f, p in zip(self.flat, self.params)]
        # Each buffer's last element, the flag "this worker has a gradient"
        # whose sum the engine writes back, read and written in place (a
        # tensor's f[-1] costs microseconds of indexing, on every gradient).
        self.flag = [ctypes.c_float.from_address(f.data_ptr() + 4 * (f.numel() - 1)) for f in self.flat]
        self.no_grad = torch.no_grad()  # entered by one thread at a time (under self.lock)
        self.join_buf = torch.zeros(self.join.elems, dtype=torch.float32) if self.join else None
        self.in_join = False  # inside optimizer.join()
        # DistributedDataParallel.join(divide_by_initial_world_size=False):
        # a step's sums are over the workers that trained in it.
        self.join_divide_by_world = True
        # DistributedDataParallel.join(throw_on_early_termination=True):
        # every worker raises in the first pass in which one has joined.
        self.join_throw = False
        self.join_last = None  # the highest rank among those that trained in the last step anyone did

        self.iteration = 0  # training steps taken so far
        self.posted = [-1] * len(self.params)  # last step each tensor was posted for
        # What each posted .grad was (its identity and in-place version):
        # step() refuses a gradient changed after it was sent (see step).
        self.grad_seen = [None] * len(self.params)
        # Each parameter's version counter at the last step(): the update
        # is applied later, so a change made in between (clamping weights
        # after step(), a hand-made update) would be silently combined
        # with it; _apply refuses that.
        self.stepped_version = [None] * len(self.params)
        self.applied = [-1] * L.layers  # last step applied, per layer
        self.applied_all = -1  # every layer applied through this step
        self.unapplied = {}  # step -> layers not yet applied
        self.hyper = {}  # step -> per-group hyper-parameters at step()
        self.no_sync_depth = 0
        self.passes = 0  # backward passes finished in this step
        self.pass_syncs = None  # in a pass: whether it posts the gradients
        self.grads_synced = False  # sync_gradients() ended the step before; step() not yet called
        self.closed = False
        # Weak references to the DistributedDataParallel wrappers it serves
        # (none for a DistributedOptimizer's): deleting them all releases it.
        self.owners = []

        if broadcast:
            self._broadcast()
        self.hooks += [hooks.on_gradient(p, self._grad_hook(t)) for t, p in enumerate(self.params)]
        if inner is not None and not self.grad_mode:
            self.hooks.append(hooks.before_forward(marked, hooks.eager(lambda *_: self.synchronize())))
        for mod in model.modules() if not self.grad_mode else ():
            if id(mod) in L.module_layer and inner is None:
                self.hooks.append(hooks.before_forward(mod, self._pre_forward([L.module_layer[id(mod)]])))
            # Reading or overwriting the parameters applies what is pending first.
            self.hooks.append(hooks.on_state_dict(mod, self.synchronize))
            self.hooks.append(hooks.on_load_state_dict(mod, self.synchronize))
        self.forward_began = self.backward_began = None
        if self.engine.tuning or self.timeline is not None:
            # Rank 0 tunes (the engine measures the steps' compute), or the
            # timeline records the forward passes: the model's, or, for the
            # modules of several wrappers, the first of theirs to run.
            for m in marked if isinstance(marked, list) else [marked]:
                self.hooks.append(m.register_forward_pre_hook(hooks.eager(self._mark_forward_begin)))
                self.hooks.append(m.register_forward_hook(hooks.eager(self._mark_forward_end)))
        self.forward_marked = -1
        # Some modules' parameters are used without calling the module (e.g.
        # MultiheadAttention reads out_proj.weight itself). The forward passes
        # before the first step record which modules run; at the first step,
        # each layer whose module did not run is applied by its nearest
        # ancestor that did.
        self.ran = set()
        probe = hooks.eager(self._probe)
        if inner is None and not self.grad_mode:
            self.probes += [m.register_forward_pre_hook(probe) for m in model.modules()]

    # Engine iteration 0 is the broadcast; training step k is k + 1.
    @staticmethod
    def _engine_iter(k):
        return k + 1

    def _stage_values(self, t, root):
        """Fills tensor t's buffer for a broadcast from root: root's values
        of the parameter, negative zeros on the other workers. x + (-0) is x
        for every x (+0 included), so the sums are root's bits."""
        f = self.flat[t]
        f.fill_(-0.0)
        if self.me == root:
            self.buf[t].copy_(self.params[t])
        return f

    def _broadcast(self):
        # Rank 0's values (_stage_values). Layers whose wire would round
        # (see layout.py) go through their float32 broadcast tensors, from
        # the same buffers; their own tensors skip iteration 0, and their
        # gates are not waited for.
        L = self.layout
        with torch.no_grad():
            for t, p in enumerate(self.params):
                f = self._stage_values(t, 0)
                tensor = L.bcast_tensor.get(t, t)
                self.engine.post(tensor, 0, f.data_ptr(), f.numel() if tensor == t else p.numel())
            flat = None
            if self.state_tensor is not None:
                flat = torch.full((L.state_elems,), -0.0, dtype=torch.float32)
                if self.me == 0:
                    off = 0
                    for _, x in L.state:
                        n = state_elems(x)
                        encode_state(x, flat[off:off + n])
                        off += n
                self.engine.post(self.state_tensor, 0, flat.data_ptr(), flat.numel())
            layers = list(L.broadcast_layers)
            if L.broadcast_layer is not None:
                layers.append(L.broadcast_layer)
            for layer in layers:
                self.engine.wait_layer(layer, 0)
            for t, p in enumerate(self.params):
                p.copy_(self.buf[t])
            if flat is not None:
                off = 0
                for _, x in L.state:
                    n = state_elems(x)
                    decode_state(flat[off:off + n], x)
                    off += n

    @contextlib.contextmanager
    def no_sync(self):
        with self.lock:
            self.no_sync_depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.no_sync_depth -= 1

    def _grad_hook(self, t):
        def hook():
            with self.lock:
                if self.pass_syncs is None:
                    # The first gradient of a backward pass decides what the
                    # pass does: the K-th pass of a step outside no_sync()
                    # posts; the others only accumulate into .grad.
                    self.pass_syncs = self.no_sync_depth == 0 and self.passes + 1 >= self.passes_per_step
                    hooks.after_backward(self._end_of_backward)
                    if self.timeline is not None and self.backward_began is None:
                        self.backward_began = now()
                if self.posted[t] == self.iteration:
                    raise AutobyteError(
                        "autobyte: the gradient of %s was computed again in step %d after it was synchronised "
                        "(backward_passes_per_step=%d): call optimizer.step() after the synchronising backward pass, "
                        "and accumulate gradients inside optimizer.no_sync() or with backward_passes_per_step"
                        % (self.names[t], self.iteration, self.passes_per_step))
                if self.pass_syncs:
                    self._post(t)
        return hook

    def _post(self, t, zero=False):
        """Posts tensor t's gradient for the current step: p.grad averaged,
        or zeros (flag 0) if p.grad is None or zero is set."""
        if self.closed:
            raise AutobyteError("autobyte: gradient of %s computed after the optimizer was shut down" % self.names[t])
        k = self.iteration
        # Posting the next step's gradients after sync_gradients() without a
        # step() in between: that update was skipped (e.g. by a GradScaler).
        self.grads_synced = False
        # The buffer still holds the previous step's sum if the parameter's
        # module did not run in this step's forward passes.
        self._apply(self.layout.layer_of[t], k - 1)
        p, f, b = self.params[t], self.flat[t], self.buf[t]
        with self.no_grad:
            g = None if zero else p.grad
            if g is not None:
                # Averaged before summing, as DDP does, so the two round
                # alike; this is the one copy on the way in.
                if g.is_sparse:
                    # A sparse embedding's: sent dense (see _grad_of).
                    b.zero_()
                    b.add_(g)
                    b.div_(self.world)
                elif g.dtype == torch.float32:
                    torch.div(g, self.world, out=b)
                else:
                    b.copy_(g)  # exact; the engine rounds the quotient to g's type on the wire
                    b.div_(self.world)
                self.flag[t].value = 1.0
            else:
                f.zero_()
        self.engine.post(t, self._engine_iter(k), f.data_ptr(), f.numel())
        self.posted[t] = k
        self.grad_seen[t] = None if g is None else (id(g), g._version)
        if self.timeline is not None:
            self.timeline.instant("post", "post", now(), step=k, layer=self.layout.layer_of[t], tensor=self.names[t])

    def _post_rest(self):
        # Parameters no gradient reached in the synchronising pass post what
        # .grad holds (gradients accumulated in earlier passes, or zeros), so
        # every worker posts every tensor.
        for t in range(len(self.params)):
            if self.posted[t] != self.iteration:
                self._post(t)

    def _end_of_backward(self):
        with self.lock:
            syncs, self.pass_syncs = self.pass_syncs, None
            self.passes += 1
            if not syncs or self.closed:
                return
            self._post_rest()
            if self.engine.tuning and self.forward_marked == self.iteration:
                self.engine.mark(Engine.BACKWARD_END, self._engine_iter(self.iteration))
            if self.timeline is not None and self.backward_began is not None:
                self.timeline.span("backward", "compute", self.backward_began, now(), step=self.iteration)
                self.backward_began = None
            if self.grad_mode:
                self._post_join(self.iteration, [])
                self._grads_in(self.iteration)

    def _pre_forward(self, layers):
        def hook(*_):
            k = self.iteration - 1
            for layer in layers:
                if self.applied[layer] < k:
                    with self.lock:
                        self._apply(layer, k)
        return hooks.eager(hook)

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
        for mid, layer in self.layout.module_layer.items():
            if mid in self.ran:
                continue
            m = parent.get(mid)
            while m is not None and id(m) not in self.ran:
                m = parent.get(id(m))
            if m is None:
                m = self.model
            extra.setdefault(id(m), []).append(layer)
        for mid, layers in extra.items():
            self.hooks.append(hooks.before_forward(by_id[mid], self._pre_forward(layers)))

    def _grad_of(self, t):
        # The summed flags: how many workers had a gradient for t.
        if self.flag[t].value <= 0:
            return None
        p = self.params[t]
        g = self.buf[t] if p.dtype == torch.float32 else self.buf[t].to(p.dtype)
        if self.layout.sparse_grad[t]:
            # A sparse embedding's sum, handed back sparse as DDP does (so
            # SparseAdam and the optimizers' sparse paths work): its rows
            # with a non-zero sum. It travels dense, all rows every step.
            g = g.to_sparse(1)
        return g

    def _apply(self, layer, k):
        """Waits for layer's sums of step k and applies the update, with
        the layers after it whose sums are in already."""
        if k < 0 or self.applied[layer] >= k:
            return
        t0 = now()
        ready = self.engine.wait_run(layer, self._engine_iter(k))
        t1 = now() if self.timeline is not None else None
        run = [layer]
        # (The engine may have layers after the model's: buffers.)
        for l in range(layer + 1, min(layer + ready, self.layout.layers)):
            if self.applied[l] >= k:
                break
            run.append(l)
        if self.timeline is not None:
            # The forward of step k+1 waits for the sums of step k; the
            # layers after it in the run were in already.
            self.timeline.span("wait layer %d" % layer, "wait", t0, t1, layer=layer, layers=run, step=k + 1)
        self._check_params_unchanged(run, k)
        # A forward under torch.inference_mode() (evaluation) may be the
        # one that applies an update: the optimizer's state must not be
        # created there as inference tensors, which no later update could
        # change in place.
        with torch.inference_mode(False), torch.no_grad():
            self.updates.apply(run, self.hyper[k], self.params, self._grad_of)
        for l in run:
            self.applied[l] = k
        self.unapplied[k] -= len(run)
        if self.unapplied[k] == 0:
            del self.unapplied[k], self.hyper[k]
            self.applied_all = k

    def _check_params_unchanged(self, layers, k):
        """Refuses to apply step k's update to a parameter changed in place
        since that step() (under DDP the update is in place when step()
        returns, so the change would follow it; here it would precede it).
        Writes through .data escape torch's version counter and this check."""
        for layer in layers:
            for t in self.layout.layer_params[layer]:
                v = self.stepped_version[t]
                if v is not None and self.params[t]._version != v:
                    raise AutobyteError(
                        "autobyte: parameter %s was changed in place after optimizer.step() of step %d, before that "
                        "step's update was applied to it: autobyte applies each layer's update when the next forward "
                        "pass reaches the layer, so the change would come before the update instead of after it. "
                        "Call optimizer.synchronize() after step() and before changing (or reading) parameters "
                        "other than through state_dict()" % (self.names[t], k))

    def _check_still_frozen(self):
        """Refuses a step once a parameter that was frozen when the
        optimizer was wrapped trains: it is no engine tensor, so its update
        would use this worker's gradient alone (DDP does that silently)."""
        for name, p in self.layout.frozen_in_opt:
            if p.requires_grad:
                raise AutobyteError(
                    "autobyte: parameter %s did not require a gradient when DistributedOptimizer was created and does "
                    "now: only the parameters trainable then are synchronised. Unfreeze it before wrapping, or call "
                    "autobyte.torch.shutdown() and wrap the optimizer again after unfreezing" % name)

    def step(self, closure=None):
        if closure is not None:
            raise AutobyteError("autobyte: %s.step(closure) is not supported: the update is applied later, layer by "
                                "layer, so the closure's loss could not be returned" % type(self.opt).__name__)
        with self.lock:
            if self.closed:
                raise AutobyteError("autobyte: optimizer.step() after shutdown")
            if self.grads_synced:
                # sync_gradients() put this step's sums in .grad: the
                # wrapped optimizer's own update, on the whole model at once.
                self.grads_synced = False
                return type(self.opt).step(self.opt)
            if getattr(self.opt, "found_inf", None) is not None:
                raise AutobyteError("autobyte: a GradScaler is stepping %s without synchronised gradients: call "
                                    "optimizer.sync_gradients() before scaler.step(optimizer), so that every worker "
                                    "checks the same gradients for inf/NaN" % type(self.opt).__name__)
            k = self.iteration
            self._check_grads_unchanged(k)
            self._check_still_frozen()
            # Gradients not yet posted (a step after fewer backward passes
            # than backward_passes_per_step, or only no_sync() passes) are
            # synchronised now, as Horovod does, so that workers stay equal.
            self._post_rest()
            self.hyper[k] = hyper_parameters(self.opt)
            self._post_join(k, self.hyper[k])
            self.stepped_version = [p._version for p in self.params]
            self.unapplied[k] = self.layout.layers
            if self.probes:
                self._delegate_silent_layers()
            self.iteration = k + 1
            self.passes = 0

    def _post_join(self, k, hyper, synced=False):
        """Posts the join tensor of step k (uneven_inputs only): this rank
        active with hyper, or (hyper None) joined."""
        if self.join is None:
            return
        if k > 0:
            # Its buffer holds step k-1's sum until that is in.
            self.engine.wait_layer(self.layout.join_layer, self._engine_iter(k - 1))
        if hyper is None:
            self.join_buf.zero_()
        else:
            self.join.encode(self.join_buf, self.me, hyper, synced)
        self.engine.post(self.layout.join_tensor, self._engine_iter(k), self.join_buf.data_ptr(), self.join_buf.numel())

    @contextlib.contextmanager
    def join_context(self):
        """optimizer.join(): the training loop runs inside; when it ends
        (this worker is out of inputs), the worker steps along with the
        others until every worker is out (see _shadow)."""
        if self.join is None:
            raise AutobyteError("autobyte: optimizer.join() needs DistributedOptimizer(..., uneven_inputs=True), on "
                                "every worker: the workers then tell one another every step which of them still train")
        with self.lock:
            if self.in_join:
                raise AutobyteError("autobyte: optimizer.join() inside optimizer.join()")
            self.in_join = True
        try:
            yield
        finally:
            with self.lock:
                self.in_join = False
        self._shadow()

    def _shadow(self):
        """Steps with zero gradients until a step in which no worker
        trained. Each step's sums (the active workers' gradients over the
        number of workers, as DDP's Join divides by default) are applied
        with the hyper-parameters of the lowest-ranked active worker, so
        that this worker's parameters and optimizer state stay the others'.
        Every worker leaves at the same step."""
        with self.lock:
            if self.closed:
                raise AutobyteError("autobyte: optimizer.join() ended after shutdown")
            while True:
                k = self.iteration
                self.grads_synced = False
                for t in range(len(self.params)):
                    if self.posted[t] != k:
                        self._post(t, zero=True)
                self._post_join(k, None)
                if self.probes:
                    self._delegate_silent_layers()
                t0 = now()
                self.engine.wait_layer(self.layout.join_layer, self._engine_iter(k))
                summed = self.join_buf
                active = self.join.active(summed)
                if self.grad_mode:
                    # DistributedDataParallel's: the update is the script's,
                    # which a joined worker does not run; its parameters
                    # are the last worker's once every worker is out.
                    self._grads_in(k)
                    if self.timeline is not None:
                        self.timeline.span("joined step", "wait", t0, now(), step=k)
                    if self.join_throw and active:
                        raise self._early_termination(k, active)
                    if not active:
                        if self.join_last is not None:
                            self._parameters_from(self.join_last)
                        return
                    continue
                for r in active:
                    if self.join.synced(summed, r):
                        raise AutobyteError(
                            "autobyte: worker %d called optimizer.sync_gradients() in step %d while worker %d had "
                            "joined (run out of inputs): a joined worker cannot repeat what the others do to the "
                            "synchronised gradients (a GradScaler's unscaling and skipped steps, gradient "
                            "clipping), so join() does not support them; drop the uneven batches instead (e.g. "
                            "DistributedSampler(drop_last=True))" % (r, k, self.me))
                own = hyper_parameters(self.opt)
                self.hyper[k] = self.join.decode(summed, active[0], own) if active else own
                self.stepped_version = [p._version for p in self.params]
                self.unapplied[k] = self.layout.layers
                self.iteration = k + 1
                self.passes = 0
                self.synchronize()
                if self.timeline is not None:
                    self.timeline.span("joined step", "wait", t0, now(), step=k)
                if not active:
                    return

    def _parameters_from(self, root):
        """One more step in which every worker takes root's parameters, as
        DDP's join ends (_stage_values), on wires that carry them exactly
        (the wrapper's join() refuses others). Buffers stay each worker's
        own."""
        k = self.iteration
        with torch.no_grad():
            for t in range(len(self.params)):
                f = self._stage_values(t, root)
                self.engine.post(t, self._engine_iter(k), f.data_ptr(), f.numel())
                self.posted[t] = k
            self._post_join(k, None)
            for layer, ts in enumerate(self.layout.layer_params):
                self.engine.wait_layer(layer, self._engine_iter(k))
                for t in ts:
                    self.params[t].copy_(self.buf[t])
            self.engine.wait_layer(self.layout.join_layer, self._engine_iter(k))
        self.applied = [k] * len(self.applied)
        self.applied_all = k
        self.iteration = k + 1

    def _check_grads_unchanged(self, k):
        """Refuses a step whose gradients were changed after backward sent
        them (gradient clipping, a hand-made scaling, zero_grad()): the
        update would silently use the unchanged sums. Under DDP .grad holds
        the averaged sum after backward, so such code works there; here it
        must call sync_gradients() first. (Writes through .data escape
        torch's version counter and this check.)"""
        for t, p in enumerate(self.params):
            if self.posted[t] != k:
                continue
            g, seen = p.grad, self.grad_seen[t]
            if (None if g is None else (id(g), g._version)) != seen:
                raise AutobyteError(
                    "autobyte: the gradient of %s changed after backward sent it (step %d), e.g. by "
                    "clip_grad_norm_ or zero_grad(): autobyte synchronises gradients while backward runs, "
                    "so this update would ignore the change. Call optimizer.sync_gradients() after backward "
                    "and before changing .grad (it puts the averaged sums in .grad, as DDP's backward does)"
                    % (self.names[t], k))

    def sync_gradients(self):
        """Ends this step's synchronisation now: waits for every sum and
        puts it, averaged over the workers, in each parameter's .grad (None
        where no worker had a gradient). The next step() applies the update
        from .grad at once; without a step() before the next backward pass,
        the update is skipped (on every worker, if they all skip it)."""
        with self.lock:
            if self.closed:
                raise AutobyteError("autobyte: optimizer.sync_gradients() after shutdown")
            if self.grads_synced:
                return
            self.synchronize()  # the step before, if its update is pending
            k = self.iteration
            self._post_rest()
            self._post_join(k, hyper_parameters(self.opt), synced=True)
            if self.probes:
                self._delegate_silent_layers()
            self._grads_in(k)
            self.grads_synced = True

    def _grads_in(self, k):
        """Waits for every sum of step k and puts it, averaged, in each
        parameter's .grad (None where no worker had a gradient); step k is
        then done. The caller holds the lock."""
        t0 = now()
        scale = None
        if self.join is not None:
            self.engine.wait_layer(self.layout.join_layer, self._engine_iter(k))
            active = self.join.active(self.join_buf)
            if active:
                self.join_last = max(active)
            if not self.join_divide_by_world and 0 < len(active) < self.world:
                scale = self.world / len(active)
        with torch.no_grad():
            for layer, ts in enumerate(self.layout.layer_params):
                self.engine.wait_layer(layer, self._engine_iter(k))
                for t in ts:
                    g, p = self._grad_of(t), self.params[t]
                    if g is not None and scale is not None:
                        g = g * scale
                    if g is None:
                        p.grad = None
                    elif g.is_sparse:
                        p.grad = g  # a tensor of its own
                    elif p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype and not p.grad.is_sparse:
                        p.grad.copy_(g)
                    else:
                        p.grad = g.clone() if g.data_ptr() == self.buf[t].data_ptr() else g
                self.applied[layer] = k
        if self.timeline is not None:
            self.timeline.span("sync gradients", "wait", t0, now(), step=k)
        self.applied_all = k
        self.iteration = k + 1
        self.passes = 0
        if self.join is not None and self.join_throw and self.in_join and len(active) < self.world:
            raise self._early_termination(k, active)

    def _early_termination(self, k, active):
        """DistributedDataParallel.join(throw_on_early_termination=True)'s
        error in step k, with DDP's words: on the workers that ran out, and
        on those that did not."""
        out = [r for r in range(self.world) if r not in active]
        first = ("Rank %d exhausted all inputs." % self.me if self.me in out else
                 "Detected at least one rank that exhausted inputs. Throwing across all ranks.")
        return AutobyteError("autobyte: %s (DistributedDataParallel.join(throw_on_early_termination=True): worker%s %s "
                             "ran out of inputs before step %d, which no worker takes)"
                             % (first, "s" if len(out) > 1 else "", ", ".join(map(str, out)), k))

    def synchronize(self):
        with self.lock:
            k = self.iteration - 1
            if self.applied_all >= k:
                return
            for layer in range(self.layout.layers):
                self._apply(layer, k)

    def load_optimizer_state(self, load, state_dict):
        """optimizer.load_state_dict: replaces the state the layers' updates
        share, so they are pointed at the new one."""
        with self.lock:
            self.synchronize()
            load(state_dict)
            self.updates.share_state()

    def live_owners(self):
        """The DistributedDataParallel wrappers over this session not deleted."""
        return [o for o in (ref() for ref in self.owners) if o is not None]

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
