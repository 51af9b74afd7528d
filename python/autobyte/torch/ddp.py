"""DistributedDataParallel: torch's DDP interface over the autobyte engine.

``model = ab.DistributedDataParallel(model)`` in place of
``torch.nn.parallel.DistributedDataParallel(model)``: the rest of a DDP
script (its own optimizer, gradient clipping, a GradScaler, ``no_sync()``)
stays as it is. Each backward pass posts every gradient as autograd
produces it, and the engine schedules the pieces by layer under the credit
window, on parameter servers or the ring; when backward returns, ``.grad``
holds the average over the workers, as under DDP.

What it does not do is cross the barrier: the update is the caller's, after
backward, so the next forward cannot start while the last layers are still
being synchronised. ``DistributedOptimizer`` (the module's main interface)
does, and is the faster of the two where communication is exposed.

DDP's keyword arguments are accepted where they mean something on the CPU
with autobyte: ``find_unused_parameters`` (nothing to do: unused
parameters' sums are zeros, flagged as no gradient, and their ``.grad``
stays None where no worker had one), ``broadcast_buffers`` (buffers are
broadcast from rank 0 once, at wrapping, whatever its value; DDP's True
broadcasts them before every forward), ``bucket_cap_mb``,
``gradient_as_bucket_view`` and ``static_graph`` (no effect), and a
``process_group`` of every rank (the default group, or a group of them
all): autobyte's workers are the whole job. GPUs (``device_ids``) and a
group of some of the ranks are refused with the reason.

``join()`` is DDP's context manager for uneven inputs (see its comment).

Several wrappers in one process (a GAN's generator and discriminator, each
with its own optimizer) share the process's one session: a wrapper made
while others are open closes theirs and opens one over all their modules
(share_session). Deleting every wrapper over a session releases it.

DDP's communication hooks that mean a wire type are taken as autobyte's
compression (``register_comm_hook``, ``register_builtin_comm_hook``):
``allreduce_hook`` (none), ``bf16_compress_hook`` and ``fp16_compress_hook``,
also through ``bf16_compress_wrapper`` / ``fp16_compress_wrapper`` around
``allreduce_hook``. The sums are float32 whatever the wire, so they are at
least as accurate as the hooks' 16-bit all-reduce. Any other hook (PowerSGD,
a script's own) is refused with the reason: autobyte sums the gradients
itself.
"""

import contextlib

import torch

from .. import AutobyteError
from .layout import compression_setting, wire_of_compression

_NO_EFFECT = ("dim", "bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view",
              "static_graph", "broadcast_buffers", "init_sync")


class DistributedDataParallel(torch.nn.Module):
    """Wraps module like torch's DistributedDataParallel (see the module's
    comment): the model's parameters and buffers are broadcast from rank 0
    now, and each backward pass leaves the workers' averaged gradients in
    .grad."""

    def __init__(self, module, device_ids=None, output_device=None, process_group=None, **kwargs):
        super().__init__()
        from . import _open_session
        if not isinstance(module, torch.nn.Module):
            raise AutobyteError("autobyte: DistributedDataParallel needs a torch.nn.Module, got %s" % type(module).__name__)
        for name, v in (("device_ids", device_ids), ("output_device", output_device)):
            if v not in (None, [], "cpu") and not (isinstance(v, torch.device) and v.type == "cpu"):
                raise AutobyteError("autobyte: DistributedDataParallel(%s=%r): autobyte trains on the CPU (GPU tensors "
                                    "are not supported yet); leave %s out" % (name, v, name))
        _check_process_group(process_group)
        unknown = sorted(k for k in kwargs if k not in _NO_EFFECT)
        if unknown:
            raise AutobyteError("autobyte: DistributedDataParallel: unsupported argument(s) %s (accepted: device_ids, "
                                "output_device, process_group, %s)" % (", ".join(unknown), ", ".join(_NO_EFFECT)))
        self.module = module
        # DDP's attributes that scripts and libraries read back: what was
        # asked for (see the module's comment for what takes effect).
        self.device_ids, self.output_device, self.dim = None, None, kwargs.get("dim", 0)
        self.broadcast_buffers = kwargs.get("broadcast_buffers", True)
        self.find_unused_parameters = kwargs.get("find_unused_parameters", False)
        self.gradient_as_bucket_view = kwargs.get("gradient_as_bucket_view", False)
        self.static_graph = kwargs.get("static_graph", False)
        dist = torch.distributed
        self.process_group = process_group if process_group is not None else (
            dist.group.WORLD if dist.is_available() and dist.is_initialized() else None)
        self._sync_held = False  # require_backward_grad_sync = False holds the session's sums
        # DDP's flag for broadcasting buffers before each forward, which
        # some libraries save and restore: kept, with no effect here.
        self.require_forward_param_sync = True
        self._autobyte = _open_session(None, module, owners=[self])
        self._comm_hook = None
        self._compression = None  # a comm hook's, for the session's next opening

    def register_comm_hook(self, state, hook):
        """DDP's: a hook that means a wire type sets this model's
        compression (see the module's comment); call it before the first
        backward pass, once, on every worker."""
        self._set_compression(_compression_of_hook(hook), "register_comm_hook(%s)" % _hook_name(hook))

    def register_builtin_comm_hook(self, comm_hook_type):
        """DDP's: ALLREDUCE (no compression) or FP16_COMPRESS (fp16)."""
        name = getattr(comm_hook_type, "name", str(comm_hook_type))
        compression = {"ALLREDUCE": "none", "FP16_COMPRESS": "fp16"}.get(name)
        if compression is None:
            raise AutobyteError("autobyte: register_builtin_comm_hook(%r): unknown hook type (known: ALLREDUCE, "
                                "FP16_COMPRESS)" % (comm_hook_type,))
        self._set_compression(compression, "register_builtin_comm_hook(%s)" % name)

    def _set_compression(self, compression, what):
        # The engine's wire types are fixed when it opens: the session opened
        # at wrapping (which broadcast rank 0's state) is closed before
        # anything was sent and opened again in the hook's compression.
        # Every worker registers the same hook at the same point, as DDP
        # requires, so they all meet at the second rendezvous.
        from . import _settings
        s = self._autobyte
        self._not_shared(what)
        if self._comm_hook is not None:
            raise AutobyteError("autobyte: %s: a communication hook was registered already (%s); DDP takes one, once"
                                % (what, self._comm_hook))
        if s.iteration > 0 or any(k >= 0 for k in s.posted):
            raise AutobyteError("autobyte: %s: register the hook before the first backward pass, as DDP requires; "
                                "gradients were sent already" % what)
        given, where = compression_setting(_settings, "init(compression=...)")
        if given not in (None, "") and (str(given).strip() == "auto"
                                        or wire_of_compression(given, where) != wire_of_compression(compression, what)):
            raise AutobyteError("autobyte: %s means compression %s, but %s is %r; keep one of the two"
                                % (what, compression, where, given))
        self._comm_hook = what
        self._compression = compression
        self._reopen(what, uneven_inputs=s.join is not None)

    def _not_shared(self, what):
        if len(self._autobyte.live_owners()) > 1:
            raise AutobyteError("autobyte: %s with several DistributedDataParallel wrappers open: they share one "
                                "session, which this would change for all of them; wrap the models together in one "
                                "nn.ModuleDict instead (or use init(compression=...) for compression)" % what)

    def _reopen(self, what, uneven_inputs):
        """Closes the session and opens it again with this wrapper's
        compression and uneven_inputs; every worker does it at the same
        point (the same call in the same step), so they all meet at the new
        rendezvous. Parameters are equal already: nothing is broadcast."""
        from . import _open_session
        s = self._autobyte
        if s.closed:
            raise AutobyteError("autobyte: %s: the session is shut down" % what)
        s.close(True)
        s = self._autobyte = _open_session(None, self.module, broadcast=False, uneven_inputs=uneven_inputs,
                                           compression=self._compression, owners=[self])
        L = s.layout
        if uneven_inputs and len(L.broadcast_layers) < L.layers:
            # (Every worker finds the same, at the same point.)
            s.close(True)
            raise AutobyteError("autobyte: DistributedDataParallel.join() with compression or float16 parameters: it "
                                "ends by giving every worker the last worker's parameters, which those wires would "
                                "round; use DistributedOptimizer(optimizer, model, uneven_inputs=True) and "
                                "optimizer.join(), whose workers stay equal all along")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _set_static_graph(self):
        """DDP's (what static_graph=True does, called after wrapping, as
        scripts with reentrant activation checkpointing do): autobyte needs
        no static graph for that, so there is nothing to do."""

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """DDP's: names module's parameters and buffers (names relative to
        module) that a wrapper made later neither synchronises nor
        broadcasts, so each worker keeps its own. Called before wrapping, as
        under DDP; torch's own method marks the module the same way."""
        from .layout import IGNORE_ATTRIBUTE
        setattr(module, IGNORE_ATTRIBUTE, params_and_buffers_to_ignore)

    def no_sync(self):
        """A context manager: backward passes in it only accumulate into
        .grad; the next one outside it synchronises the sum (DDP's)."""
        return self._autobyte.no_sync()

    @property
    def require_backward_grad_sync(self):
        """DDP's flag, False inside no_sync(). Setting it to False, as
        DDP's no_sync() does and as some training libraries do themselves,
        makes backward passes only accumulate into .grad until it is set to
        True again."""
        return self._autobyte.no_sync_depth == 0

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, sync):
        if not isinstance(sync, bool):
            raise AutobyteError("autobyte: DistributedDataParallel.require_backward_grad_sync = %r: want True or False"
                                % (sync,))
        s = self._autobyte
        with s.lock:
            if sync == self._sync_held:  # a change: held and told to sync, or free and told not to
                s.no_sync_depth += -1 if sync else 1
                self._sync_held = not sync

    @property
    def _autobyte(self):
        return self._session

    @_autobyte.setter
    def _autobyte(self, session):
        # A wrapper's session changes when it is opened again (a comm hook,
        # join()) or shared with a new wrapper: a hold it has moves along.
        if self._sync_held:
            with session.lock:
                session.no_sync_depth += 1
        self._session = session

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
        """DDP's context manager for uneven inputs: the training loop runs
        inside, on every worker. A worker whose loop has ended takes part
        in the others' backward passes with zero gradients until every
        worker's loop has ended; then every worker takes the parameters of
        the highest-ranked worker among the last to train, as DDP does
        (buffers stay each worker's own, as under broadcast_buffers=False).
        The sums are over the number of workers (divide_by_initial_world_size,
        DDP's default) or over those that trained in that pass.

        throw_on_early_termination=True: in the first backward pass in
        which a worker has run out, every worker raises instead (DDP's
        RuntimeError): the joined one as its loop ends, the others when
        that pass's sums are in .grad, before their optimizers step, so
        every worker keeps the parameters of the last full step. (Under DDP
        the others raise in that pass's forward.)"""
        for name, v in (("divide_by_initial_world_size", divide_by_initial_world_size), ("enable", enable),
                        ("throw_on_early_termination", throw_on_early_termination)):
            if not isinstance(v, bool):
                raise AutobyteError("autobyte: DistributedDataParallel.join(%s=%r): want True or False" % (name, v))
        if not enable:
            yield
            return
        s = self._autobyte
        if s.join is None:
            self._not_shared("join()")
            # The workers tell one another who still trains through one more
            # tensor every pass, which the engine learns when it opens.
            self._reopen("join()", uneven_inputs=True)
            s = self._autobyte
        s.join_divide_by_world = divide_by_initial_world_size
        s.join_throw = throw_on_early_termination
        with s.join_context():
            yield

    def autobyte_report(self):
        """The tuner and the configurations applied (see DistributedOptimizer)."""
        return self._autobyte.report()


class _Shared(torch.nn.Module):
    """The modules of several DistributedDataParallel wrappers, which one
    session synchronises together. It is never called itself."""

    def __init__(self, modules):
        super().__init__()
        self.members = torch.nn.ModuleList(modules)


def share_session(session, owners, new):
    """Closes session, which serves the DistributedDataParallel wrappers
    owners, and opens one over their modules and those of new (wrappers
    being made), as a DDP script with a model per wrapper (a GAN's
    generator and discriminator) needs: DDP gives each wrapper its own
    reducer, autobyte one session per process. Each backward pass then
    averages the gradients of every model it reached, and the others' are
    flagged as none, as when the models are wrapped together in one
    nn.ModuleDict. Rank 0's parameters and buffers of every model are
    broadcast, as DDP's constructor does for the new one's."""
    from . import _open_session, _settings
    from .session import check_wrappable
    wrapped = owners + new
    for o in new:
        # Before the open session is closed: a model it cannot take leaves
        # the wrappers already made as they were.
        check_wrappable(o.module, _settings)
    for o in owners:
        what = "a communication hook (%s)" % o._comm_hook if o._comm_hook else "join()" if session.join else None
        if what:
            raise AutobyteError("autobyte: a second DistributedDataParallel while the first has %s: wrappers in one "
                                "process share one session, which the hook or join() would change for all of them; "
                                "wrap every model first, or the models together in one nn.ModuleDict, or use "
                                "init(compression=...) for compression" % what)
    session.close(True)
    modules = []
    for o in wrapped:
        if all(o.module is not m for m in modules):
            modules.append(o.module)
    s = _open_session(None, _Shared(modules), owners=wrapped, marked=modules)
    for o in owners:
        o._autobyte = s
    return s


def _hook_name(hook):
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


def _check_process_group(group):
    """Accepts no group, or one of every rank of torch.distributed's job
    (the default group, or new_group() over all ranks), which is what
    autobyte synchronises over; refuses a subgroup with the sizes."""
    if group is None:
        return
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise AutobyteError("autobyte: DistributedDataParallel(process_group=%r): torch.distributed is not initialised, "
                            "so that group is none of this job's; leave process_group out" % (group,))
    try:
        n = dist.get_world_size(group)
    except (RuntimeError, ValueError) as e:
        raise AutobyteError("autobyte: DistributedDataParallel(process_group=%r): not a process group of this job (%s)"
                            % (group, e)) from None
    if n < 0:  # torch's answer for a group this rank is not in
        what = "a group that this rank (%d) is not in" % dist.get_rank()
    elif n != dist.get_world_size():
        what = "a group of %d of the job's %d ranks" % (n, dist.get_world_size())
    else:
        return
    raise AutobyteError("autobyte: DistributedDataParallel(process_group=...): %s; autobyte synchronises every worker "
                        "of the job, so it takes only a group of them all (or none)" % what)


def _compression_of_hook(hook):
    """The compression DDP's hook means, or an AutobyteError naming it."""
    default = None
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    except ImportError:  # a torch without torch.distributed
        pass
    if default is not None:
        known = {default.allreduce_hook: "none", default.bf16_compress_hook: "bf16",
                 default.fp16_compress_hook: "fp16"}
        if hook in known:
            return known[hook]
        # bf16_compress_wrapper(allreduce_hook) and fp16_compress_wrapper(...):
        # closures over the hook they wrap.
        for kind in ("bf16", "fp16"):
            if _hook_name(hook).startswith(kind + "_compress_wrapper."):
                inner = [c.cell_contents for c in (getattr(hook, "__closure__", None) or ())]
                if default.allreduce_hook in inner:
                    return kind
    raise AutobyteError("autobyte: register_comm_hook(%s): autobyte sums the gradients itself, so it takes only the "
                        "hooks that mean a wire type: default_hooks.allreduce_hook, bf16_compress_hook and "
                        "fp16_compress_hook (or bf16_compress_wrapper / fp16_compress_wrapper around allreduce_hook); "
                        "for another hook, keep torch's DistributedDataParallel" % _hook_name(hook))
