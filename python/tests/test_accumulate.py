"""Gradient accumulation against DDP's model.no_sync() on gloo.

3 micro-batches per step, 8 steps, 2 workers, the features model (a weight
shared by two modules, a frozen weight, BatchNorm, and a branch unused on
odd steps, so that some parameters have no gradient anywhere in a step),
Adam. autobyte accumulates with optimizer.no_sync() over a parameter
server, and with backward_passes_per_step=3 over ring all-reduce. With 2
workers every sum is a + b in any order, so both must give DDP's
parameters to the rounding of identical arithmetic (0 measured); the bound
is the suite's TOL.
"""

import sys
import unittest

import torch

from helpers import Compare, reference, run_ok, tmp, worst

ARGS = ["--model", "features", "--optimizer", "adam", "--iterations", "8", "--accumulate", "3", "--batch", "8"]


class Accumulate(unittest.TestCase, Compare):
    ddp = None  # DDP's result, run once for both tests

    def want(self):
        if Accumulate.ddp is None:
            out = tmp("acc-ddp.pt")
            run_ok(self, ["--workers", "2", "--arch", "allreduce"], ["--backend", "ddp", "--out", out] + ARGS)
            Accumulate.ddp = torch.load(out)
            # DDP itself accumulates: it matches the exact update of the
            # 2 x 3 micro-batches (the comparison below is not with a
            # run that accumulates nothing).
            ref = reference(self, ARGS + ["--workers", "2"], tmp("acc-ref.pt"))
            self.assertSameTraining(Accumulate.ddp, ref, "DDP vs reference", params_only=self.params(ref))
            self.assertMoved(Accumulate.ddp, "DDP")
        return Accumulate.ddp

    @staticmethod
    def params(r):
        # BatchNorm's running statistics are each worker's own.
        return [k for k in r["state"] if "running" not in k and "num_batches" not in k]

    def check(self, launch_args, how):
        want = self.want()
        out = tmp("acc-%s.pt" % how)
        run_ok(self, ["--workers", "2"] + launch_args, ["--backend", "autobyte", "--accumulate-with", how, "--out", out] + ARGS)
        got = torch.load(out)
        self.assertSameTraining(got, want, "autobyte (%s) vs DDP" % how, params_only=self.params(got))
        self.assertRanksEqual(out, 2, keys=self.params(got))
        self.assertEqual(int(got["state"]["bn.num_batches_tracked"]), 8 * 3, "BatchNorm saw every micro-batch")
        wl, wp, wk = worst(got, want, self.params(got))
        print("\n  %s: autobyte vs DDP: losses %.1e, parameters %.1e (%s)" % (how, wl, wp, wk), file=sys.stderr)

    def test_no_sync_ps(self):
        self.check(["--servers", "1", "--partition", "256B", "--credit", "1KB"], "no_sync")

    def test_backward_passes_per_step_allreduce(self):
        self.check(["--arch", "allreduce", "--partition", "256B", "--credit", "1KB"], "passes")


if __name__ == "__main__":
    unittest.main()
