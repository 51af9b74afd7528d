"""What the workers tell one another every step when inputs are uneven.

With ``DistributedOptimizer(..., uneven_inputs=True)`` every step posts one
more float32 tensor, the join tensor: one slot per rank, in which a rank
still training writes that it is active, whether this step's update went
through ``sync_gradients()``, and its optimizer's numeric hyper-parameters
as they were at ``step()``; a rank that has run out of inputs (joined)
writes zeros. The sum over the workers is then every slot at once: exactly,
since each slot holds one rank's values plus zeros.

A joined rank reads from it who is still training and applies each step's
sums with the hyper-parameters of the lowest-ranked active worker, so that
its parameters and optimizer state stay those of the others bit for bit
(a learning-rate scheduler stepped by the active ranks included). Once no
rank is active every rank leaves the join at the same step.

Hyper-parameters are Python floats (float64) or one-element tensors; a
float32 cannot hold a float64, so each value travels as its 64 bits in
four 16-bit pieces, each an integer a float32 holds exactly.
"""

import struct

import torch

from .. import AutobyteError

_ACTIVE, _SYNCED, _HEADER = 0, 1, 2
_PIECES = 4  # 16-bit pieces of a float64


def _numbers(v):
    """The float64 values of a hyper-parameter that travels, or None for
    one that does not (booleans, None, strings: settings no scheduler
    changes)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return [float(v)]
    if torch.is_tensor(v) and v.numel() == 1 and not v.is_complex():
        return [float(v.item())]
    if isinstance(v, (tuple, list)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return None


class JoinCodec:
    """Encodes this rank's slot and decodes the summed slots."""

    def __init__(self, optimizer, world):
        self.world = world
        # (group, key, count): the numeric hyper-parameters, fixed at
        # wrapping (a key a scheduler adds later, such as initial_lr, does
        # not change an update, and stays the joined rank's own).
        self.fields = []
        for gi, g in enumerate(optimizer.param_groups):
            for key in sorted(k for k in g if k != "params"):
                nums = _numbers(g[key])
                if nums is not None:
                    self.fields.append((gi, key, len(nums)))
        self.values = sum(n for _, _, n in self.fields)
        self.slot = _HEADER + _PIECES * self.values
        self.elems = self.world * self.slot

    def encode(self, buf, rank, hyper, synced):
        """Writes rank's slot of buf (a float32 tensor of elems): active,
        synced, and the hyper-parameters of step() (per-group dicts); zeros
        everywhere else."""
        buf.zero_()
        base = rank * self.slot
        buf[base + _ACTIVE] = 1.0
        buf[base + _SYNCED] = 1.0 if synced else 0.0
        vals = []
        for gi, key, n in self.fields:
            v = hyper[gi].get(key) if gi < len(hyper) else None
            nums = _numbers(v)
            if nums is None or len(nums) != n:
                raise AutobyteError("autobyte: hyper-parameter %r of parameter group %d is %r, which was %d number(s) "
                                    "when the optimizer was wrapped; with uneven_inputs=True a joined worker applies "
                                    "the others' hyper-parameters, so their kind must not change" % (key, gi, v, n))
            vals.extend(nums)
        if vals:
            pieces = struct.unpack("<%dH" % (_PIECES * len(vals)), struct.pack("<%dd" % len(vals), *vals))
            buf[base + _HEADER:base + self.slot] = torch.tensor(pieces, dtype=torch.float32)

    def active(self, summed):
        """The ranks whose slot in the summed buffer says they trained."""
        flags = summed[_ACTIVE::self.slot].tolist()
        return [r for r, f in enumerate(flags) if f > 0]

    def synced(self, summed, rank):
        return summed[rank * self.slot + _SYNCED].item() > 0

    def decode(self, summed, rank, own):
        """rank's hyper-parameters from the summed buffer, laid over own
        (the joined rank's per-group dicts at this step, for what does not
        travel); each value keeps own's kind (float, int, tensor, tuple)."""
        base = rank * self.slot
        pieces = [int(x) for x in summed[base + _HEADER:base + self.slot].tolist()]
        vals = struct.unpack("<%dd" % self.values, struct.pack("<%dH" % len(pieces), *pieces)) if pieces else ()
        hyper = [dict(g) for g in own]
        i = 0
        for gi, key, n in self.fields:
            got, i = vals[i:i + n], i + n
            mine = hyper[gi].get(key)
            if torch.is_tensor(mine):
                v = mine.clone()
                v.fill_(got[0])
            elif isinstance(mine, (tuple, list)):
                v = type(mine)(type(x)(y) for x, y in zip(mine, got))
            elif isinstance(mine, int):
                v = int(got[0])
            else:
                v = got[0]
            hyper[gi][key] = v
        return hyper
