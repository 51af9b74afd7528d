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
    optimizer.synchronize()   # before reading or changing the parameters other than through state_dict()

How it works (ByteScheduler's design, the paper's "cross the barrier"):

* Each trainable parameter is one tensor of the engine; the parameters of one
  module form one layer, and lower layers go first (layout.py).
* When autograd has accumulated a parameter's gradient, a hook (hooks.py)
  copies it into a buffer the engine owns and posts it; the engine schedules
  its pieces by layer under the credit window and writes the sum over all
  workers back into the same buffer (session.py).
* ``optimizer.step()`` does not wait. A forward pre-hook on each module waits
  for that module's own parameters only and applies the optimizer's update
  to them alone (optim.py), so the next forward pass starts while later
  layers are still being synchronised.
* At start, rank 0's parameters and buffers are broadcast to every worker.

Gradient accumulation: backward passes inside ``optimizer.no_sync()`` only
accumulate into ``.grad`` (DDP's ``model.no_sync()``), and
``DistributedOptimizer(..., backward_passes_per_step=K)`` synchronises every
K-th pass (Horovod's). ``model.state_dict()``, ``optimizer.state_dict()`` and
both ``load_state_dict()`` apply pending updates first, so checkpoints can be
taken and loaded at any step.

Uneven inputs (DDP's Join): with ``DistributedOptimizer(...,
uneven_inputs=True)`` and the loop inside ``with optimizer.join():``, a
worker out of data steps along with zero gradients, applying the others'
updates with their hyper-parameters, until no worker trains (join.py).

16-bit training:

* A model converted with ``model.to(torch.bfloat16)`` or ``model.half()``
  trains as is: each parameter's gradient travels in the parameter's own
  type (half the bytes), is summed in float32 on the servers or around the
  ring and rounded back to that type, and the update is computed in that
  type, as plain torch and DDP do. Parameters of other dtypes than float32,
  bfloat16 and float16 are refused. (The engine's staging buffers are
  float32: twice a 16-bit model's parameter memory.)
* ``ab.init(compression="bf16")`` or ``"fp16"`` (or ``autobyte launch
  --compression``, which sets AUTOBYTE_COMPRESSION) sends a float32 model's
  gradients in 16 bits: each worker's averaged gradient is rounded on the
  way out, the sum is kept in float32 and rounded once more on the way back
  (once per hop on the ring), and the parameters and the update stay
  float32, like DDP's bf16_compress_hook and fp16_compress_hook. fp16
  payloads carry a power-of-two scale, so gradients neither overflow nor
  flush to zero. ``"none"`` (the default) sends float32; ``"auto"`` lets
  the autobyte tuner (AUTOBYTE_TUNER=autobyte) switch bf16 on and off while
  the job runs. The start-of-job broadcast of rank 0's parameters and
  buffers never goes through a compressed tensor: it stays exact.
* ``torch.autocast("cpu", dtype=torch.bfloat16)`` needs nothing: the
  parameters and their gradients stay float32.
* Loss scaling (``torch.amp.GradScaler("cpu")``, e.g. with float16
  autocast, which torch 2 has on the CPU; torch 1.13 has neither) must see
  the synchronised gradients, or each worker would decide on its own
  whether to skip a step. Call ``optimizer.sync_gradients()`` between
  backward and ``scaler.step(optimizer)``::

      scaler.scale(loss).backward()
      optimizer.sync_gradients()   # this step's sums, averaged, in .grad
      scaler.step(optimizer)       # every worker sees the same inf/NaN, skips alike
      scaler.update()

  sync_gradients() ends the step's communication and the next step()
  applies the whole update at once (as DDP does), instead of layer by layer
  in the next forward. Gradient clipping (``clip_grad_norm_``) uses it the
  same way: called between backward and step() without it, it would change
  gradients whose sums are already on their way, so step() refuses any
  ``.grad`` changed in place, replaced or zeroed after backward. An inf or
  NaN on any worker reaches every worker's sum, compressed or not. A
  GradScaler stepping a fused optimizer without it is refused.

Parameters after ``step()``: the update is applied when the next forward
reaches each layer, so code that reads or changes parameters between
``step()`` and the next forward (a moving average of the weights, weight
clipping) calls ``optimizer.synchronize()`` first. A parameter changed in
place without it is refused when its update would be applied.
"""

import atexit
import datetime
import gc
import os
import secrets
import sys
import types
import weakref

from .. import AutobyteError
from .._native import library_path
from .layout import wire_of_compression
from .optim import PER_PARAMETER, check_supported
from .session import Session

import torch

__all__ = ["init", "rank", "size", "DistributedOptimizer", "DistributedDataParallel", "shutdown", "AutobyteError",
           "SUPPORTED_OPTIMIZERS"]

SUPPORTED_OPTIMIZERS = PER_PARAMETER

_settings = {}
_initialised = False
_sessions = []  # weak references to live sessions

_KNOWN = {"arch", "servers", "scheduler", "partition", "credit", "shard", "server_weights", "ps_pull", "bandwidth",
          "peer_timeout", "rendezvous_timeout", "timeout", "log_level", "listen", "trace", "compression", "fusion"}


def _setting(name):
    """init()'s value of a variable, else the environment's; "" if neither."""
    v = _settings.get(name, os.environ.get(name))
    return "" if v is None else v


def _env_int(name, default):
    v = _setting(name)
    if v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise AutobyteError("autobyte: environment %s=%r is not an integer" % (name, v)) from None
    if n < 0:
        raise AutobyteError("autobyte: environment %s=%r is negative" % (name, v))
    return n


def init(rank=None, world_size=None, master_addr=None, master_port=None, **settings):
    """Prepares this process: checks RANK and WORLD_SIZE, loads (or builds)
    the engine.

    rank, world_size, master_addr and master_port, as
    torch.distributed.init_process_group takes them (e.g. in processes
    started by torch.multiprocessing.spawn), override RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT; autobyte's rank 0 listens at
    master_port + 1, since torch.distributed owns master_port.

    Keyword settings override the AUTOBYTE_* environment, e.g.
    ``init(partition="1MB", credit="4MB", scheduler="bytescheduler")``;
    names are arch, servers, scheduler, partition, credit, shard,
    server_weights (parameter servers: the share of the bytes each server
    is given, one number per server, e.g. "4:4:1"; default even by bytes),
    fusion (fuse neighbouring parameters smaller than this, e.g. "256KB",
    into one message, like DDP's buckets; default 0: never; auto: the
    autobyte tuner, AUTOBYTE_TUNER=autobyte, switches between none and 1 MiB
    as it measures), bandwidth, peer_timeout, rendezvous_timeout (e.g.
    "90s": how long to wait for every worker to join; default 10 minutes),
    timeout (how long the training thread waits for sums before it fails,
    e.g. "5m", seconds or a datetime.timedelta; default 30 minutes, as
    torch.distributed's; 0: for ever), log_level, trace (a file for this worker's timeline, see
    autobyte.timeline) and compression (none, bf16 or fp16: the type float32
    parameters' gradients travel in; auto: the autobyte tuner,
    AUTOBYTE_TUNER=autobyte, turns bf16 on while the job is
    communication-bound)."""
    global _initialised
    for k, v in settings.items():
        if k not in _KNOWN:
            raise AutobyteError("autobyte.init: unknown setting %r (known: %s)" % (k, ", ".join(sorted(_KNOWN))))
        if k == "compression":
            wire_of_compression(v, "compression")
    given = {}
    for name, v, lo, hi in (("RANK", rank, 0, None), ("WORLD_SIZE", world_size, 1, None), ("MASTER_PORT", master_port, 1, 65534)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise AutobyteError("autobyte.init: %s=%r must be an integer in [%d, %s]" % (name.lower(), v, lo, hi if hi is not None else "..."))
        given[name] = str(v)
    if master_addr is not None:
        if not isinstance(master_addr, str) or not master_addr:
            raise AutobyteError("autobyte.init: master_addr=%r must be a host name or address" % (master_addr,))
        given["MASTER_ADDR"] = master_addr
    before = dict(_settings)
    _settings.update(given)
    for k, v in settings.items():
        if isinstance(v, datetime.timedelta):
            v = "%gs" % v.total_seconds()
        _settings["AUTOBYTE_" + k.upper()] = str(v)
    try:
        r, n = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        if r >= n:
            raise AutobyteError("autobyte: RANK=%d is out of range for WORLD_SIZE=%d" % (r, n))
    except AutobyteError:
        _settings.clear()
        _settings.update(before)  # a refused init changes nothing
        raise
    library_path()
    _initialised = True


def rank():
    """This worker's rank (init's rank, else $RANK, default 0)."""
    return _env_int("RANK", 0)


def size():
    """The number of workers (init's world_size, else $WORLD_SIZE, default 1)."""
    return _env_int("WORLD_SIZE", 1)


def shutdown(ok=True):
    """Applies every outstanding update and leaves the job (also done at exit)."""
    for ref in list(_sessions):
        s = ref()
        if s is not None:
            s.close(ok)


def _uncaught_exception():
    # The interpreter stores an uncaught exception in sys.last_value (3.12:
    # also sys.last_exc) when it prints it, before atexit handlers run; a
    # clean exit or sys.exit() leaves them unset.
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


@atexit.register
def _at_exit():
    failed = _uncaught_exception() is not None
    for ref in list(_sessions):
        s = ref()
        if s is None or not s.engine.owned_here():
            # A child forked from the worker (os.fork, a fork-started
            # process exiting through sys.exit) inherits the session but not
            # the engine's threads: closing it there would wait for ever.
            continue
        try:
            s.close(not failed, "its training script raised an exception" if failed else None)
        except AutobyteError as e:
            print(e, file=sys.stderr)


def _tracked_like(scheduled, step, optimizer):
    """step, keeping what a learning-rate scheduler created before wrapping
    had added to optimizer.step (scheduled; step itself if none had): the
    record that step() was called, which the scheduler checks (else it warns that optimizer.step() "has been
    overridden" and counts from the wrong step). torch 2 marks
    optimizer._opt_called; torch 1.13 counts optimizer._step_count."""
    marked_called = getattr(scheduled, "_wrapped_by_lr_sched", False)
    counted = getattr(scheduled, "_with_counter", False)
    if not (marked_called or counted):
        return step
    opt_ref = weakref.ref(optimizer)

    def tracked(*args, **kwargs):
        opt = opt_ref()
        if marked_called:
            opt._opt_called = True
        if counted:
            opt._step_count = getattr(opt, "_step_count", 0) + 1
        return step(*args, **kwargs)

    # torch 2 tests the marker with hasattr: set only the ones scheduled has.
    if marked_called:
        tracked._wrapped_by_lr_sched = True
    if counted:
        tracked._with_counter = True
    return tracked


def _open_session(optimizer, model, broadcast=True, backward_passes_per_step=1, uneven_inputs=False, compression=None,
                  owners=(), marked=None):
    """The process's one open session over model (optimizer None:
    DistributedDataParallel's, which leaves the update to the caller);
    compression overrides the job's for this session. owners are the
    DistributedDataParallel wrappers it serves: a session whose wrappers
    were all deleted is closed by the next opening, and a wrapper made while
    others are open shares one session with them (ddp.share_session). Every
    worker deletes and wraps at the same point of the same script, so they
    all close and open alike. marked: the modules whose forward passes
    mark a step (the model by default)."""
    for other in _open_sessions():
        live = other.live_owners()
        if other.owners and not live:
            other.close(True)
            continue
        if live and optimizer is None and owners:
            from .ddp import share_session
            return share_session(other, live, list(owners))
        held = "a DistributedDataParallel" if live else "a DistributedOptimizer"
        raise AutobyteError(
            "autobyte: this process already has %s open (over a %s with %d parameters); a DistributedOptimizer "
            "synchronises its model alone, so models trained at once by separate optimizers (a GAN's generator and "
            "discriminator, say) go through autobyte.torch.DistributedDataParallel, a wrapper per model or one over "
            "an nn.ModuleDict of them, each with its own optimizer; or, when done with the first, call "
            "autobyte.torch.shutdown() (or delete its DistributedDataParallel, e.g. del model, on every worker) "
            "before distributing the next" % (held, type(other.model).__name__, len(other.params)))
    _follow_process_group()
    if not _initialised:
        init()
    settings = dict(_settings)
    if compression is not None:
        settings["AUTOBYTE_COMPRESSION"] = compression
    s = Session(optimizer, model, settings, rank(), size(), broadcast, backward_passes_per_step, uneven_inputs, marked)
    s.owners = [weakref.ref(o) for o in owners]
    _sessions.append(weakref.ref(s))
    return s


def _follow_process_group():
    """Takes from torch.distributed's default process group, where the
    script initialised one, what autobyte was not told: the rank and world
    size (a script started by torch.multiprocessing.spawn passes them to
    init_process_group, not the environment), and the job's secret, which
    rank 0 draws and broadcasts through the group where AUTOBYTE_TOKEN is
    unset. A rank or world size autobyte was told must be the group's.
    Every worker opens its session at the same point of the same script,
    so they all reach the broadcast together."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    r, n = dist.get_rank(), dist.get_world_size()
    told = [k for k in ("RANK", "WORLD_SIZE") if _setting(k) != ""]
    if not told:
        _settings["RANK"], _settings["WORLD_SIZE"] = str(r), str(n)
    elif (rank(), size()) != (r, n):
        raise AutobyteError("autobyte: this process is rank %d of %d in torch.distributed's process group, but rank %d "
                            "of %d to autobyte (%s, from init() or the environment); they must be the same job"
                            % (r, n, rank(), size(), " and ".join(told)))
    if n > 1 and _setting("AUTOBYTE_TOKEN") == "":
        token = [secrets.token_hex(16) if r == 0 else None]
        dist.broadcast_object_list(token, src=0)
        _settings["AUTOBYTE_TOKEN"] = token[0]


def _open_sessions():
    """The sessions still open. A DistributedDataParallel that was deleted
    but sits in a reference cycle is collected first, so that its session
    counts as released."""
    live = [s for s in (ref() for ref in _sessions) if s is not None and not s.closed]
    if any(s.owners for s in live):
        gc.collect()
    return live


def DistributedOptimizer(optimizer, model, broadcast=True, backward_passes_per_step=1, uneven_inputs=False):
    """Makes optimizer data-parallel over the job's workers and returns it.

    The same object is returned (so learning-rate schedulers made before or
    after keep working; its parameter groups are fixed from now on),
    with step(), state_dict() and load_state_dict() bound to the engine and
    five methods added: no_sync() (a context manager: backward passes in it
    only accumulate gradients), synchronize(), sync_gradients() (this
    step's synchronised gradients in .grad now, for a GradScaler or
    gradient clipping; step() then updates at once), join() (with
    uneven_inputs=True, below) and autobyte_report();
    zero_grad() is the optimizer's own. Rank 0's parameters and buffers are
    broadcast first (unless broadcast=False). backward_passes_per_step=K
    accumulates K backward passes per step() and synchronises the K-th.
    uneven_inputs=True (on every worker) lets workers run different numbers
    of steps: the training loop runs inside ``with optimizer.join():``, and
    a worker whose loop ends first keeps stepping with zero gradients,
    applying the others' updates, until every worker's loop has ended
    (DDP's Join; see docs/pytorch.md).
    Supported: torch.optim's per-parameter optimizers (SUPPORTED_OPTIMIZERS)."""
    check_supported(optimizer)
    if not isinstance(model, torch.nn.Module):
        raise AutobyteError("autobyte: DistributedOptimizer needs the model (a torch.nn.Module), got %s" % type(model).__name__)
    if getattr(optimizer, "_autobyte", None) is not None:
        raise AutobyteError("autobyte: this optimizer is already distributed")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise AutobyteError("autobyte: backward_passes_per_step must be an integer >= 1, got %r" % (backward_passes_per_step,))
    if not isinstance(uneven_inputs, bool):
        raise AutobyteError("autobyte: uneven_inputs must be True or False, got %r" % (uneven_inputs,))
    s = _open_session(optimizer, model, broadcast, backward_passes_per_step, uneven_inputs)
    optimizer._autobyte = s
    state_dict, load_state_dict = optimizer.state_dict, optimizer.load_state_dict

    # Bound to the optimizer itself (not the session): learning-rate
    # schedulers wrap optimizer.step and count calls on its __self__.
    def step(self, closure=None):
        return self._autobyte.step(closure)

    def synchronize(self):
        self._autobyte.synchronize()

    def sync_gradients(self):
        self._autobyte.sync_gradients()

    def no_sync(self):
        return self._autobyte.no_sync()

    def join(self):
        return self._autobyte.join_context()

    def autobyte_report(self):
        return self._autobyte.report()

    def synced_state_dict(self):
        self._autobyte.synchronize()
        return state_dict()

    def synced_load_state_dict(self, sd):
        self._autobyte.load_optimizer_state(load_state_dict, sd)

    def add_param_group(self, group):
        raise AutobyteError(
            "autobyte: add_param_group() after DistributedOptimizer: the engine's tensors are fixed when it is "
            "created. Add every group before wrapping, or call autobyte.torch.shutdown() and wrap the optimizer "
            "again after adding it")

    # A learning-rate scheduler made before wrapping may have wrapped optimizer.step.
    optimizer.step = _tracked_like(optimizer.step, types.MethodType(step, optimizer), optimizer)
    optimizer.add_param_group = types.MethodType(add_param_group, optimizer)
    optimizer.synchronize = types.MethodType(synchronize, optimizer)
    optimizer.sync_gradients = types.MethodType(sync_gradients, optimizer)
    optimizer.no_sync = types.MethodType(no_sync, optimizer)
    optimizer.join = types.MethodType(join, optimizer)
    optimizer.autobyte_report = types.MethodType(autobyte_report, optimizer)
    optimizer.state_dict = types.MethodType(synced_state_dict, optimizer)
    optimizer.load_state_dict = types.MethodType(synced_load_state_dict, optimizer)
    return optimizer


from .ddp import DistributedDataParallel  # noqa: E402  (it opens sessions through _open_session)
