"""Which tensors the engine synchronises, and in which layers.

Each trainable float32 parameter the optimizer updates is one engine tensor.
The parameters a module owns directly form one layer; layers are numbered in
``model.modules()`` order (forward order for ``nn.Sequential``-style models,
and the order ByteScheduler's PyTorch plugin uses), and lower layers are sent
first. A parameter registered in several modules belongs to the first.
Everything else the model holds (frozen parameters, parameters the optimizer
does not update, buffers) is rank 0's state, broadcast once at the start.
"""

import torch

from .. import AutobyteError

# The broadcast sends state as float32 sums (rank 0's values plus zeros),
# which is exact for these dtypes and for integers up to 2**24.
_EXACT_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def check_broadcastable(name, t):
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


class Layout:
    """The model's parameters as engine tensors and layers.

    params[t], names[t], layer_of[t], group_of[t]: tensor t's parameter, its
    name in the model, its layer and its optimizer parameter group.
    layer_params[l]: the tensors of layer l. module_layer: id(module) -> the
    layer of the parameters it owns. state: (description, tensor) of
    everything rank 0 broadcasts besides the parameters.
    """

    def __init__(self, model, optimizer):
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

        self.params, self.names, self.layer_of, self.group_of = [], [], [], []
        self.layer_params = []
        self.module_layer = {}
        seen = set()
        for mod in model.modules():
            ids = []
            for _, p in mod.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad or id(p) not in in_opt:
                    continue
                seen.add(id(p))
                name = names[id(p)]
                if p.device.type != "cpu":
                    raise AutobyteError("autobyte: parameter %s is on device %s; the engine reads gradients from CPU memory, so train on the CPU (GPU tensors are not supported yet)" % (name, p.device))
                if p.dtype != torch.float32:
                    raise AutobyteError("autobyte: parameter %s has dtype %s; only float32 parameters can be trained (convert the model with .float())" % (name, p.dtype))
                if p.is_sparse:
                    raise AutobyteError("autobyte: parameter %s is sparse; only dense parameters are supported" % name)
                ids.append(len(self.params))
                self.params.append(p)
                self.names.append(name)
                self.group_of.append(in_opt[id(p)])
            if ids:
                layer = len(self.layer_params)
                self.layer_params.append(ids)
                self.module_layer[id(mod)] = layer
                self.layer_of.extend([layer] * len(ids))
        if not self.params:
            raise AutobyteError("autobyte: the model has no trainable float32 parameters in the optimizer; nothing to synchronise")

        trainable = set(id(p) for p in self.params)
        self.state = []
        for n, p in model.named_parameters():
            if id(p) not in trainable:
                self.state.append(("parameter " + n, p))
        for n, b in model.named_buffers():
            self.state.append(("buffer " + n, b))
        for n, t in self.state:
            check_broadcastable(n, t)
        self.state_elems = sum(t.numel() for _, t in self.state)

    @property
    def layers(self):
        return len(self.layer_params)

    def engine_tensors(self, extra):
        """The engine's tensor list: every parameter with `extra` more
        elements, then the broadcast state as one more layer if any."""
        tensors = [{"name": self.names[t], "layer": self.layer_of[t], "elems": self.params[t].numel() + extra}
                   for t in range(len(self.params))]
        if self.state_elems:
            tensors.append({"name": "(broadcast state)", "layer": self.layers, "elems": self.state_elems})
        return tensors
