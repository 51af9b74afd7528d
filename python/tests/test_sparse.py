"""Sparse embeddings (nn.Embedding / nn.EmbeddingBag with sparse=True), as
recommendation models have them: their gradients are sparse.

The engine sums them dense; the wrapper hands each sum back as a sparse
gradient, as DDP does, so the script's own optimizers keep their sparse
paths (SparseAdam for the embeddings beside Adam for the rest), and
DistributedOptimizer updates them with its optimizer's sparse path. Each
case runs 3 workers against the exact update (dp_worker.py's reference: one
process, every worker's batches), with every worker ending on the same
parameters; with 2 workers the wrapper gives DDP's bits.
"""

import unittest

import torch

from helpers import Compare, reference, run_ok, tmp

EMBEDDINGS = ("bag.weight", "item.weight")


class SparseEmbeddings(unittest.TestCase, Compare):
    def check(self, backend, optimizer, launch_args, what):
        args = ["--model", "sparse", "--optimizer", optimizer, "--iterations", "8", "--batch", "6"]
        want = reference(self, args + ["--workers", "3"], tmp("sparse-ref-%s.pt" % optimizer))
        self.assertMoved(want, "the reference")
        for k in EMBEDDINGS:
            self.assertTrue(want["sparse_grads"][k], "the reference's %s gradient is not sparse" % k)
        out = tmp("sparse-%s.pt" % what)
        run_ok(self, ["--workers", "3"] + launch_args, ["--backend", backend, "--out", out] + args)
        got = torch.load(out)
        self.assertSameTraining(got, want, what)
        self.assertRanksEqual(out, 3)
        self.assertMoved(got, what)
        return got

    def test_wrapper_sparse_adam_and_adam_on_servers(self):
        got = self.check("autobyte-ddp", "sparseadam+adam", ["--servers", "2", "--partition", "256B", "--credit", "1KB"],
                         "wrapper, SparseAdam + Adam, ps")
        # SparseAdam refuses a dense gradient: training at all shows the
        # sums came back sparse; the record says so too.
        for k in EMBEDDINGS:
            self.assertTrue(got["sparse_grads"][k], "%s's gradient came back dense" % k)
        self.assertFalse(got["sparse_grads"]["fc.weight"], "a dense layer's gradient came back sparse")

    def test_wrapper_against_ddp(self):
        # 2 workers (every sum a + b, in any order): DDP's sparse all-reduce
        # on gloo and autobyte's dense sums give the same bits, and the
        # gradients come back sparse on both.
        args = ["--model", "sparse", "--optimizer", "sparseadam+adam", "--iterations", "6", "--batch", "6"]
        want_out = tmp("sparse-ddp.pt")
        run_ok(self, ["--workers", "2", "--arch", "allreduce"], ["--backend", "ddp", "--out", want_out] + args)
        want = torch.load(want_out)
        self.assertMoved(want, "DDP")
        for launch_args in (["--servers", "1"], ["--arch", "allreduce", "--partition", "128B", "--credit", "512B"]):
            out = tmp("sparse-vs-ddp-%d.pt" % len(launch_args))
            run_ok(self, ["--workers", "2"] + launch_args, ["--backend", "autobyte-ddp", "--out", out] + args)
            got = torch.load(out)
            self.assertEqual(got["losses"], want["losses"], launch_args)
            for k, v in want["state"].items():
                self.assertTrue(torch.equal(got["state"][k], v), "%s: %s differs from DDP's" % (launch_args, k))
            self.assertEqual(got["sparse_grads"], want["sparse_grads"])

    def test_wrapper_momentum_on_the_ring(self):
        self.check("autobyte-ddp", "momentum", ["--arch", "allreduce", "--partition", "128B", "--credit", "512B"],
                   "wrapper, SGD momentum, ring")

    def test_optimizer_adagrad_on_the_ring(self):
        self.check("autobyte", "adagrad", ["--arch", "allreduce"], "DistributedOptimizer, Adagrad, ring")

    def test_optimizer_momentum_on_servers(self):
        self.check("autobyte", "momentum", ["--servers", "2", "--partition", "256B", "--credit", "1KB"],
                   "DistributedOptimizer, SGD momentum, ps")


if __name__ == "__main__":
    unittest.main()
