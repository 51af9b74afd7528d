"""Which tensors the engine synchronises, in which layers, and in which types.

Each trainable parameter the optimizer updates (float32, bfloat16 or
float16) is one engine tensor.
The parameters a module owns directly form one layer; layers are numbered in
``model.modules()`` order (forward order for ``nn.Sequential``-style models,
and the order ByteScheduler's PyTorch plugin uses), and lower layers are sent
first. A parameter registered in several modules belongs to the first.
Everything else the model holds (frozen parameters, parameters the optimizer
does not update, buffers) is rank 0's state, broadcast once at the start.

Wire types: a 16-bit parameter's gradient travels in its own type; a float32
parameter's in the job's compression (float32 unless AUTOBYTE_COMPRESSION or
init(compression=...) says bf16 or fp16). The engine is always handed
float32 buffers and rounds them to the wire type itself.

The broadcast at the start must be exact, so a parameter goes through its
own tensor only where that tensor's wire carries rank 0's values unchanged:
a float32 wire, or a bfloat16 parameter on its bfloat16 wire (rank 0's
values plus zeros, rounded once to bfloat16, are rank 0's values). The
parameters of every other layer (compressed float32 ones, and float16 ones,
whose per-payload scale can push subnormals out of range) are broadcast
through float32 tensors of their own in one more layer, with the state;
those tensors are posted at iteration 0 only, from the same staging
buffers, so they cost no memory.
"""

import os

import torch

from .. import AutobyteError

# The broadcast sends state (buffers, frozen parameters) as float32 sums:
# rank 0's values plus negative zeros from the others, so rank 0's bits
# arrive. Tensors of these dtypes travel as their values, which float32
# holds exactly; any other (float64, int32, int64, complex) travels as its
# bytes, two to a float32 value (0-65535, exact too), whatever it holds.
_BY_VALUE = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.uint8, torch.bool)


def state_elems(t):
    """The float32 values state tensor t travels in."""
    return t.numel() if t.dtype in _BY_VALUE else (t.numel() * t.element_size() + 1) // 2


def encode_state(t, out):
    """Writes state tensor t into out (state_elems(t) float32 values)."""
    if t.dtype in _BY_VALUE:
        out.copy_(t.detach().reshape(-1).to(torch.float32))
        return
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if b.numel() % 2:
        b = torch.cat([b, b.new_zeros(1)])
    out.copy_(b.view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).to(torch.float32))


def decode_state(values, t):
    """Overwrites state tensor t with what encode_state wrote into values."""
    if t.dtype in _BY_VALUE:
        t.copy_(values.reshape(t.shape).to(t.dtype))
        return
    v = values.to(torch.int32)
    halves = torch.where(v >= 32768, v - 65536, v).to(torch.int16)
    t.copy_(halves.view(torch.uint8)[:t.numel() * t.element_size()].view(t.dtype).reshape(t.shape))


# The parameters autobyte trains, and the wire type each 16-bit one travels in.
_WIRE_OF = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
TRAINABLE = (torch.float32,) + tuple(_WIRE_OF)

# compression= / AUTOBYTE_COMPRESSION values, as the engine reads them
# (dtype.Parse), and the wire type each means for float32 parameters.
_COMPRESSION = {"none": "float32", "float32": "float32", "fp32": "float32", "f32": "float32", "": "float32",
                "bf16": "bfloat16", "bfloat16": "bfloat16",
                "fp16": "float16", "float16": "float16", "f16": "float16", "half": "float16"}


def compression_setting(settings, init_name="compression"):
    """The job's compression as (value, where it came from): init()'s
    setting (in settings, named init_name in errors), else the environment's
    AUTOBYTE_COMPRESSION, else None."""
    if settings.get("AUTOBYTE_COMPRESSION") is not None:
        return settings["AUTOBYTE_COMPRESSION"], init_name
    return os.environ.get("AUTOBYTE_COMPRESSION"), "environment AUTOBYTE_COMPRESSION"


def wire_of_compression(value, where):
    """The wire type of float32 parameters at iteration 0 (the broadcast)
    under compression `value`: none, bf16 or fp16 (None: none), or auto
    (the autobyte tuner may turn bf16 on later; it starts uncompressed).
    where names the setting in errors."""
    if value is None or str(value) == "auto":
        return "float32"
    wire = _COMPRESSION.get(str(value).strip().lower())
    if wire is None:
        raise AutobyteError("autobyte: %s=%r is not a compression: want none, bf16, fp16 or auto" % (where, value))
    return wire


def check_broadcastable(name, t):
    if t.device.type != "cpu":
        raise AutobyteError("autobyte: %s is on device %s; only CPU tensors are supported" % (name, t.device))
    if t.is_sparse:
        raise AutobyteError("autobyte: %s is a sparse tensor; only dense tensors are supported" % name)
    if t.dtype in _BY_VALUE:
        return
    try:
        t.detach().reshape(-1)[:1].contiguous().view(torch.uint8)
    except (RuntimeError, TypeError) as e:
        raise AutobyteError("autobyte: %s has dtype %s, whose bytes the broadcast cannot carry (%s)" % (name, t.dtype, e))


IGNORE_ATTRIBUTE = "_ddp_params_and_buffers_to_ignore"


def _ignored(model):
    """The ids of the parameters and buffers that DDP's
    _set_params_and_buffers_to_ignore_for_model named on model or any of
    its modules (by names relative to that module, as DDP takes them):
    neither synchronised nor broadcast, each worker keeping its own. A
    name that is no parameter or buffer is refused, where DDP would pass
    over it and synchronise what a typo meant to keep apart."""
    ids = set()
    for prefix, mod in model.named_modules():
        names = getattr(mod, IGNORE_ATTRIBUTE, None)
        if not names:
            continue
        if isinstance(names, str):
            raise AutobyteError("autobyte: %s%s is a string (%r); want a list of parameter and buffer names"
                                % (prefix + "." if prefix else "", IGNORE_ATTRIBUTE, names))
        tensors = dict(mod.named_parameters())
        tensors.update(mod.named_buffers())
        unknown = [n for n in names if n not in tensors]
        if unknown:
            raise AutobyteError("autobyte: parameters and buffers to ignore %s are none of %s's (it has %s)"
                                % (", ".join(map(repr, unknown)), prefix or "the model",
                                   ", ".join(list(tensors)[:6]) + (", ..." if len(tensors) > 6 else "")))
        ids.update(id(tensors[n]) for n in names)
    return ids


class Layout:
    """The model's parameters as engine tensors and layers.

    params[t], names[t], layer_of[t], group_of[t], wire[t]: tensor t's
    parameter, its name in the model, its layer, its optimizer parameter
    group and the type its gradient travels in at iteration 0 (16-bit
    parameters: always). layer_params[l]: the tensors
    of layer l. module_layer: id(module) -> the layer of the parameters it
    owns. state: (description, tensor) of everything rank 0 broadcasts
    besides the parameters. broadcast_layers: the layers whose parameters
    are broadcast through their own tensors; bcast_tensor[t]: the float32
    broadcast tensor of parameter t of any other layer (see the module's
    docstring).
    """

    def __init__(self, model, optimizer, compression="float32"):
        in_opt = {}
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                in_opt[id(p)] = gi
        names = {}
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
        # A lazy module's (nn.LazyLinear, ...) parameters and buffers have no
        # shape until its first forward pass: nothing to lay out or broadcast.
        for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            for n, t in named:
                if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
                    raise AutobyteError("autobyte: %s %s is not initialised yet (a lazy module): run one forward pass, "
                                        "e.g. on a dummy batch, before wrapping the optimizer, as DDP requires too" % (kind, n))
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                if id(p) not in names:
                    raise AutobyteError("autobyte: the optimizer's parameter group %d holds a %s tensor that is not a parameter of the model" % (gi, tuple(p.shape)))

        ignored = _ignored(model)
        # How many modules hold each parameter directly: a weight tied to
        # another module gets a dense gradient, whatever its embedding says.
        holders = {}
        for mod in model.modules():
            for _, p in mod.named_parameters(recurse=False):
                holders[id(p)] = holders.get(id(p), 0) + 1

        self.params, self.names, self.layer_of, self.group_of, self.wire = [], [], [], [], []
        # Per tensor: the weight of an nn.Embedding or nn.EmbeddingBag with
        # sparse=True (and in no other module), whose sum is handed back as
        # a sparse gradient, as under DDP (see session.py).
        self.sparse_grad = []
        self.layer_params = []
        self.module_layer = {}
        seen = set()
        for mod in model.modules():
            ids = []
            for _, p in mod.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad or id(p) not in in_opt or id(p) in ignored:
                    continue
                seen.add(id(p))
                name = names[id(p)]
                if p.device.type != "cpu":
                    raise AutobyteError("autobyte: parameter %s is on device %s; the engine reads gradients from CPU memory, so train on the CPU (GPU tensors are not supported yet)" % (name, p.device))
                if p.dtype not in TRAINABLE:
                    raise AutobyteError("autobyte: parameter %s has dtype %s; autobyte trains float32, bfloat16 and float16 parameters "
                                        "(convert the model with .float(), .bfloat16() or .half())" % (name, p.dtype))
                if p.is_sparse:
                    raise AutobyteError("autobyte: parameter %s is sparse; only dense parameters are supported" % name)
                ids.append(len(self.params))
                self.params.append(p)
                self.names.append(name)
                self.group_of.append(in_opt[id(p)])
                self.wire.append(_WIRE_OF.get(p.dtype, compression))
                self.sparse_grad.append(isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.sparse
                                        and p is mod.weight and holders[id(p)] == 1)
            if ids:
                layer = len(self.layer_params)
                self.layer_params.append(ids)
                self.module_layer[id(mod)] = layer
                self.layer_of.extend([layer] * len(ids))
        if not self.params:
            raise AutobyteError("autobyte: the model has no trainable float32 parameters in the optimizer (nor bfloat16 or float16 ones); nothing to synchronise")

        trainable = set(id(p) for p in self.params)
        # The optimizer's parameters that are no engine tensor (frozen now):
        # one that becomes trainable later would be trained apart from the
        # others (session.py refuses that).
        self.frozen_in_opt = [(names[id(p)], p) for g in optimizer.param_groups for p in g["params"]
                              if id(p) not in trainable and id(p) not in ignored]
        # Trainable parameters the optimizer does not hold: broadcast once,
        # never synchronised (a second, local optimizer would let the
        # workers drift apart; DDP would synchronise their gradients).
        self.outside_opt = [n for n, p in model.named_parameters()
                            if p.requires_grad and id(p) not in in_opt and id(p) not in ignored]
        self.state = []
        for n, p in model.named_parameters():
            if id(p) not in trainable and id(p) not in ignored:
                self.state.append(("parameter " + n, p))
        for n, b in model.named_buffers():
            if id(b) not in ignored:
                self.state.append(("buffer " + n, b))
        for n, t in self.state:
            check_broadcastable(n, t)
        self.state_elems = sum(state_elems(t) for _, t in self.state)

        def exact(t):
            return self.wire[t] == "float32" or (self.wire[t] == "bfloat16" and self.params[t].dtype == torch.bfloat16)
        # A layer's gate opens when all its tensors are in: its parameters
        # are broadcast all through their own tensors or none.
        self.broadcast_layers = [l for l, ts in enumerate(self.layer_params) if all(exact(t) for t in ts)]
        own = set(self.broadcast_layers)
        self.bcast_tensor = {}
        n = len(self.params)
        for t in range(len(self.params)):
            if self.layer_of[t] not in own:
                self.bcast_tensor[t] = n
                n += 1
        self.state_tensor = n if self.state_elems else None

    @property
    def layers(self):
        return len(self.layer_params)

    @property
    def broadcast_layer(self):
        """The layer of the float32 broadcast tensors, or None if there are none."""
        return self.layers if self.bcast_tensor or self.state_elems else None

    @property
    def join_layer(self):
        """The layer of the join tensor (see join.py): after every other."""
        return self.layers + (1 if self.broadcast_layer is not None else 0)

    @property
    def join_tensor(self):
        """The join tensor's index in engine_tensors' list: after every other."""
        return len(self.params) + len(self.bcast_tensor) + (1 if self.state_elems else 0)

    def engine_tensors(self, extra, join_elems=0):
        """The engine's tensor list: every parameter with `extra` more
        elements, then, as one more layer, the float32 broadcast tensors of
        the parameters that need them (bcast_tensor) and the state (if any),
        then, with join_elems, the join tensor in a layer of its own.
        16-bit parameters pin their own type as the wire, the broadcast
        pins float32; float32 parameters leave it to the job's compression
        (the engine reads it; a tuner may change it for later iterations,
        never for iteration 0, the broadcast)."""
        # "iterations" tells the engine which iterations post a tensor, so
        # that no gate (nor fifo's barrier) waits for one never posted: the
        # broadcast tensors are posted in iteration 0 only, the parameters
        # they broadcast from iteration 1 on.
        tensors = []
        for t, p in enumerate(self.params):
            tensor = {"name": self.names[t], "layer": self.layer_of[t], "elems": p.numel() + extra}
            if p.dtype in _WIRE_OF:
                tensor["wire"] = _WIRE_OF[p.dtype]  # pinned; float32 ones travel in the job's compression
            if t in self.bcast_tensor:
                tensor["iterations"] = "after_first"
            tensors.append(tensor)
        for t in sorted(self.bcast_tensor, key=self.bcast_tensor.get):
            tensors.append({"name": "(broadcast) " + self.names[t], "layer": self.layers,
                            "elems": self.params[t].numel(), "wire": "float32", "iterations": "first"})
        if self.state_elems:
            tensors.append({"name": "(broadcast state)", "layer": self.layers, "elems": self.state_elems, "wire": "float32",
                            "iterations": "first"})
        if join_elems:
            # Uneven inputs: which workers still train, and their
            # hyper-parameters, every step, exactly (join.py).
            tensors.append({"name": "(join)", "layer": self.join_layer, "elems": join_elems, "wire": "float32",
                            "iterations": "after_first"})
        return tensors
