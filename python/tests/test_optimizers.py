"""Every per-parameter torch.optim optimizer against DDP.

One 2-worker job per backend trains a fresh model with each optimizer in
turn (autobyte: one session after another over ring all-reduce; DDP: on
gloo). Each optimizer has three parameter groups (one per module, with
their own learning rate and weight decay) that use, where this torch has
them on the CPU, the for-loop, foreach and fused implementations, and a
StepLR scheduler halves the learning rates every 3 steps.

With 2 workers every sum is a + b, the same in any order, so autobyte and
DDP agree to the rounding of the optimizer's own arithmetic (0 measured);
the bound is the suite's TOL.

Nothing is skipped: there is one test per optimizer class this torch
has, and test_every_optimizer_is_covered_or_refused enumerates
torch.optim's classes and asserts that each one either has its test here
or is refused by DistributedOptimizer with a message naming it. An
implementation this torch lacks on the CPU is named on stderr.
"""

import inspect
import sys
import unittest

import torch

import dp_worker
from helpers import Compare, run_ok, tmp, worst

import autobyte.torch as ab
from autobyte import AutobyteError

NAMES = [n for n in dp_worker.OPTIMIZERS if hasattr(torch.optim, dp_worker.OPTIMIZERS[n][0])]
ARGS = ["--model", "smooth", "--groups", "--scheduler", "--iterations", "8", "--batch", "8", "--optimizer", ",".join(NAMES)]
_runs = {}


def runs(test):
    if not _runs:
        for backend, arch in (("ddp", []), ("autobyte", ["--partition", "4KB", "--credit", "16KB"])):
            out = tmp("opt-%s.pt" % backend)
            run_ok(test, ["--workers", "2", "--arch", "allreduce"] + arch, ["--backend", backend, "--out", out] + ARGS)
            _runs[backend] = out
    return _runs


def torch_optimizers():
    """torch.optim's optimizer classes in this torch, by name."""
    return {n: c for n, c in vars(torch.optim).items()
            if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}


class Optimizers(unittest.TestCase, Compare):
    def check(self, name):
        cls_name = dp_worker.OPTIMIZERS[name][0]
        label = cls_name + (" (Nesterov)" if name == "nesterov" else "")
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

    def test_every_optimizer_is_covered_or_refused(self):
        covered = {dp_worker.OPTIMIZERS[n][0] for n in NAMES}
        supported = {c.__name__ for c in ab.SUPPORTED_OPTIMIZERS}
        self.assertEqual(supported, covered, "the plugin supports %s; this file tests %s" % (sorted(supported), sorted(covered)))
        refused = []
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
        try:
            for name, cls in sorted(torch_optimizers().items()):
                if name in covered:
                    continue
                with self.subTest(optimizer=name):
                    opt = cls(list(model.parameters()), lr=0.01)
                    with self.assertRaisesRegex(AutobyteError, r"autobyte: %s is not supported" % name):
                        ab.DistributedOptimizer(opt, model)
                    refused.append(name)
        finally:
            ab.shutdown()
        self.assertEqual(sorted(set(torch_optimizers()) - covered), refused)
        absent = sorted(set(c for c, _ in dp_worker.OPTIMIZERS.values()) - set(torch_optimizers()))
        print("\n  torch %s: %d optimizer classes: covered %s; refused %s%s" % (
            torch.__version__, len(torch_optimizers()), ", ".join(sorted(covered)), ", ".join(refused),
            "; not in this torch: " + ", ".join(absent) if absent else ""), file=sys.stderr)


for _name in NAMES:
    setattr(Optimizers, "test_" + _name, lambda self, n=_name: self.check(n))


if __name__ == "__main__":
    unittest.main()
