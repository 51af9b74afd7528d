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
``gradient_as_bucket_view`` and ``static_graph`` (no effect). GPUs
(``device_ids``), another ``process_group`` and DDP's ``join()`` are
refused with the reason.
"""

import torch

from .. import AutobyteError

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
        if process_group is not None:
            raise AutobyteError("autobyte: DistributedDataParallel(process_group=...): autobyte's workers are the job's "
                                "(RANK, WORLD_SIZE); leave process_group out")
        unknown = sorted(k for k in kwargs if k not in _NO_EFFECT)
        if unknown:
            raise AutobyteError("autobyte: DistributedDataParallel: unsupported argument(s) %s (accepted: device_ids, "
                                "output_device, process_group, %s)" % (", ".join(unknown), ", ".join(_NO_EFFECT)))
        self.module = module
        self._autobyte = _open_session(None, module)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def no_sync(self):
        """A context manager: backward passes in it only accumulate into
        .grad; the next one outside it synchronises the sum (DDP's)."""
        return self._autobyte.no_sync()

    def join(self, *args, **kwargs):
        raise AutobyteError("autobyte: DistributedDataParallel.join() is not supported: for uneven inputs, use "
                            "DistributedOptimizer(optimizer, model, uneven_inputs=True) and optimizer.join()")

    def autobyte_report(self):
        """The tuner and the configurations applied (see DistributedOptimizer)."""
        return self._autobyte.report()
