"""The autograd and module hooks the plugin needs, on every supported torch.

torch 2.1 added ``Tensor.register_post_accumulate_grad_hook``, which runs
once a parameter's gradient has been accumulated into ``.grad``; before it,
the same moment is a hook on the parameter's ``AccumulateGrad`` node (the
way Horovod and ByteScheduler hook PyTorch 1.x). Likewise state_dict
pre-hooks are public from torch 2.0; on 1.13 a state_dict post-hook does the
job (see on_state_dict).
"""

import sys

import torch

POST_ACCUMULATE_GRAD = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
STATE_DICT_PRE_HOOK = hasattr(torch.nn.Module, "register_state_dict_pre_hook")


class _NodeHook:
    """A hook on an AccumulateGrad node; the node lives as long as we hold
    it (autograd keeps it only while a graph refers to the parameter)."""

    def __init__(self, node, handle):
        self.node, self.handle = node, handle

    def remove(self):
        self.handle.remove()
        self.node = None


def on_gradient(p, fn):
    """Calls fn() each time autograd has accumulated p's gradient into
    p.grad. Returns a handle with remove()."""
    if POST_ACCUMULATE_GRAD:
        return p.register_post_accumulate_grad_hook(lambda _p: fn())
    node = p.expand_as(p).grad_fn.next_functions[0][0]
    return _NodeHook(node, node.register_hook(lambda *_: fn()))


def before_forward(module, fn):
    """Registers fn as a forward pre-hook of module that runs before the
    module's other pre-hooks. Hooks that compute a parameter from others
    (nn.utils.weight_norm, spectral_norm) run as pre-hooks and save those
    parameters for backward; an update applied after them would change
    saved tensors in place. Returns a handle with remove()."""
    try:
        return module.register_forward_pre_hook(fn, prepend=True)
    except TypeError:  # torch 1.13: no prepend; the hooks are an OrderedDict
        handle = module.register_forward_pre_hook(fn)
        module._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle


def after_backward(fn):
    """Runs fn() once the current backward pass has finished (call it from
    inside the pass, e.g. from a gradient hook)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def on_state_dict(module, fn):
    """Calls fn() whenever module.state_dict() reads module's tensors, before
    the caller sees them."""
    if STATE_DICT_PRE_HOOK:
        return module.register_state_dict_pre_hook(lambda *_: fn())
    # torch 1.13 has only a post-hook. The state dict holds detached views
    # of the parameters (or the parameters, with keep_vars), so updates fn()
    # applies in place show through before state_dict() returns.
    return module._register_state_dict_hook(lambda *_: fn())


def on_load_state_dict(module, fn):
    """Calls fn() before module.load_state_dict() writes module's tensors."""
    if hasattr(module, "register_load_state_dict_pre_hook"):
        return module.register_load_state_dict_pre_hook(lambda *_: fn())
    return module._register_load_state_dict_pre_hook(lambda *_: fn())


def eager(fn):
    """fn as a hook torch.compile runs outside its graphs (a graph break)
    instead of tracing into the engine's calls. It is always a plain
    function, never a bound method: copy.deepcopy(model) (AveragedModel,
    a target network) copies a module's hooks, a function by reference but
    a bound method with its object, the session and its locks, which
    cannot be copied."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None)
    if disable is not None:
        return disable(fn)
    return lambda *args, **kwargs: fn(*args, **kwargs)


def compiled_inner(model):
    """The module that torch.compile(model) wraps, or None if model is not
    such a wrapper."""
    if "torch._dynamo" not in sys.modules:
        return None  # nothing was compiled in this process
    from torch._dynamo.eval_frame import OptimizedModule
    return model._orig_mod if isinstance(model, OptimizedModule) else None
