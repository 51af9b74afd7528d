"""Every per-parameter torch.optim optimizer against DDP.

One 2-worker job per backend trains a fresh model with each optimizer in
turn (autobyte: one session after another over ring all-reduce; DDP: on
gloo). Each optimizer has three parameter groups (one per module, with
their own learning rate and weight decay) that use, where this torch has
them on the CPU, the for-loop, foreach and fused implementations, and a
StepLR scheduler halves the learning rates every 3 steps.

With 2 workers every sum is a + b, the same in any order, so autobyte and
DDP agree to the rounding of the optimizer's own arithmetic (0 measured);
the bound is the suite's TOL. An optimizer this torch lacks is skipped,
and the skip says so; an implementation it lacks is named on stderr.
"""

import sys
import unittest

import torch

import dp_worker
from helpers import Compare, run_ok, tmp, worst

NAMES = list(dp_worker.OPTIMIZERS)
HAVE = [n for n in NAMES if hasattr(torch.optim, dp_worker.OPTIMIZERS[n][0])]
ARGS = ["--model", "smooth", "--groups", "--scheduler", "--iterations", "8", "--batch", "8", "--optimizer", ",".join(HAVE)]
_runs = {}


def runs(test):
    if not _runs:
        for backend, arch in (("ddp", []), ("autobyte", ["--partition", "4KB", "--credit", "16KB"])):
            out = tmp("opt-%s.pt" % backend)
            run_ok(test, ["--workers", "2", "--arch", "allreduce"] + arch, ["--backend", backend, "--out", out] + ARGS)
            _runs[backend] = out
    return _runs


class Optimizers(unittest.TestCase, Compare):
    def check(self, name):
        cls_name = dp_worker.OPTIMIZERS[name][0]
        label = cls_name + (" (Nesterov)" if name == "nesterov" else "")
        if name not in HAVE:
            self.skipTest("torch %s has no torch.optim.%s" % (torch.__version__, cls_name))
        impls = dp_worker.implementations(getattr(torch.optim, cls_name))
        lacking = [i for i in ("foreach", "fused") if i not in impls]
        print("\n  %s: groups use %s%s" % (label, ", ".join(impls), "; torch %s offers no %s %s on the CPU" % (
            torch.__version__, " or ".join(lacking), cls_name) if lacking else ""), file=sys.stderr)
        r = runs(self)
        got = torch.load("%s.%s" % (r["autobyte"], name))
        want = torch.load("%s.%s" % (r["ddp"], name))
        self.assertMoved(want, "DDP " + label)
        self.assertSameTraining(got, want, "autobyte %s vs DDP" % label)
        wl, wp, wk = worst(got, want)
        print("  %s: autobyte vs DDP: losses %.1e, parameters %.1e (%s)" % (label, wl, wp, wk), file=sys.stderr)


for _name in NAMES:
    setattr(Optimizers, "test_" + _name, lambda self, n=_name: self.check(n))


if __name__ == "__main__":
    unittest.main()
