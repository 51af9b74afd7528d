"""Applying the wrapped optimizer's update a few layers at a time.

A layer's update runs as soon as its sums are in, before the rest of the
model is synchronised, together with the layers after it whose sums are in
too. For that, each parameter group gets an instance of the optimizer's own
class, sharing the optimizer's state, that steps just the parameters of
those layers; its hyper-parameters are the group's as they were when step()
was called. This is exact for every optimizer whose update of a parameter
reads only that parameter's gradient and state.
"""

import inspect

import torch

from .. import AutobyteError

# torch.optim optimizers whose update is per parameter (those this torch
# has). foreach and fused are per-group options of the same classes.
PER_PARAMETER = tuple(getattr(torch.optim, n) for n in (
    "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop",
    "Adafactor", "Muon") if hasattr(torch.optim, n))

# Why these are refused.
_REFUSED = {
    "LBFGS": "its step(closure) re-evaluates the loss and its line search couples every parameter",
    "SparseAdam": "it takes sparse embeddings' weights only, and a process has one DistributedOptimizer; use "
                  "autobyte.torch.DistributedDataParallel, which hands sparse embeddings' gradients back sparse and "
                  "leaves the updates to the script's optimizers (SparseAdam for the embeddings, another for the rest)",
}


def check_supported(optimizer):
    cls = type(optimizer)
    if cls in PER_PARAMETER:
        return
    name = cls.__name__
    why = _REFUSED.get(name) if cls.__module__.startswith("torch.optim") else None
    supported = ", ".join(c.__name__ for c in PER_PARAMETER)
    if why:
        raise AutobyteError("autobyte: %s is not supported: %s (supported: %s)" % (name, why, supported))
    raise AutobyteError("autobyte: %s is not supported; autobyte applies each layer's update on its own as soon as its "
                        "gradients are synchronised, which is exact for torch.optim's per-parameter optimizers: %s. "
                        "With another optimizer, wrap the model with autobyte.torch.DistributedDataParallel, which "
                        "leaves the update to the script's optimizer" % (name, supported))


def hyper_parameters(optimizer):
    """Every group's settings now, without its parameters. Tensors are
    copied: schedulers may change a tensor learning rate in place."""
    return [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


class LayerUpdates:
    """The optimizer's update, a run of layers at a time."""

    def __init__(self, optimizer, layout):
        self.optimizer = optimizer
        accepted = inspect.signature(type(optimizer).__init__).parameters
        # layer -> [(group, tensors of the layer in that group)]
        self.groups_of = []
        for ts in layout.layer_params:
            by_group = {}
            for t in ts:
                by_group.setdefault(layout.group_of[t], []).append(t)
            self.groups_of.append(sorted(by_group.items()))
        # group -> an optimizer of the wrapped class for that group, whose
        # parameter list is set to the tensors being updated at each call:
        # one step() for a whole run of layers, whose Python overhead is
        # what a layer-by-layer update pays once per layer.
        self.subs = {}
        for gi, g in enumerate(optimizer.param_groups):
            if g["params"]:
                kw = {k: v for k, v in g.items() if k != "params" and k in accepted}
                self.subs[gi] = type(optimizer)(list(g["params"]), **kw)
        self.share_state()

    def share_state(self):
        """Points every group's optimizer at the optimizer's state (again
        after optimizer.load_state_dict, which replaces it)."""
        for sub in self.subs.values():
            sub.state = self.optimizer.state

    def apply(self, layers, hyper, params, grad):
        """Runs the update of layers with grad(t) as tensor t's gradient
        (None: no worker had one, so the optimizer leaves it alone, as it
        would in one process)."""
        by_group = {}
        for layer in layers:
            for gi, ts in self.groups_of[layer]:
                by_group.setdefault(gi, []).extend(ts)
        for gi, ts in sorted(by_group.items()):
            sub = self.subs[gi]
            group = sub.param_groups[0]
            group.update(hyper[gi])
            group["params"] = [params[t] for t in ts]
            saved = [params[t].grad for t in ts]
            for t in ts:
                params[t].grad = grad(t)
            try:
                sub.step()
            finally:
                for t, s in zip(ts, saved):
                    params[t].grad = s
