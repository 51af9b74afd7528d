"""autobyte.torch.DistributedDataParallel, DDP's interface, against DDP.

A DDP script with the wrapper in place of torch's: its own optimizer
(dp_worker.py --backend autobyte-ddp). The features model (a weight shared
by two modules, a frozen weight, BatchNorm, a branch unused on odd steps)
with Adam and 3 micro-batches per step, accumulated in model.no_sync(), 2
workers: every sum is a + b in any order, so the wrapper must give DDP's
parameters to the rounding of identical arithmetic, on a parameter server
and on the ring. With 3 workers (sums rounded in another order than the
reference's) the smooth model with SGD stays within the suite's TOL of the
exact update, and every worker ends with the same parameters. A GAN (two
models, an optimizer each, wrapped together as one ModuleDict) trains to
the exact update with 3 workers too.
"""

import os
import sys
import unittest

import torch

import gan_worker
from helpers import TOL, Compare, launch, reference, rel, run_ok, tmp, worst

GAN_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gan_worker.py")

ARGS = ["--model", "features", "--optimizer", "adam", "--iterations", "8", "--accumulate", "3", "--batch", "8"]


def params(r):
    # BatchNorm's running statistics are each worker's own.
    return [k for k in r["state"] if "running" not in k and "num_batches" not in k]


class Wrapper(unittest.TestCase, Compare):
    ddp = None

    def want(self):
        if Wrapper.ddp is None:
            out = tmp("wrap-ddp.pt")
            run_ok(self, ["--workers", "2", "--arch", "allreduce"], ["--backend", "ddp", "--out", out] + ARGS)
            Wrapper.ddp = torch.load(out)
            self.assertMoved(Wrapper.ddp, "DDP")
        return Wrapper.ddp

    def check(self, launch_args, what, extra=()):
        want = self.want()
        out = tmp("wrap-%s.pt" % what)
        run_ok(self, ["--workers", "2"] + launch_args, ["--backend", "autobyte-ddp", "--out", out] + ARGS + list(extra))
        got = torch.load(out)
        self.assertSameTraining(got, want, "wrapper (%s) vs DDP" % what, params_only=params(got))
        self.assertRanksEqual(out, 2, keys=params(got))
        self.assertEqual(int(got["state"]["bn.num_batches_tracked"]), 8 * 3, "BatchNorm saw every micro-batch")
        self.assertEqual(got["synced"], 8, "backward passes synchronised in 8 steps of 3 micro-batches")
        wl, wp, wk = worst(got, want, params(got))
        print("\n  wrapper (%s) vs DDP: losses %.1e, parameters %.1e (%s)" % (what, wl, wp, wk), file=sys.stderr)

    def test_ps_against_ddp(self):
        self.check(["--servers", "1", "--partition", "256B", "--credit", "1KB"], "ps")

    def test_allreduce_against_ddp(self):
        self.check(["--arch", "allreduce", "--partition", "256B", "--credit", "1KB"], "allreduce")

    def test_require_backward_grad_sync(self):
        # DDP's flag set by hand, as some training libraries accumulate,
        # against DDP's no_sync(): the same sums. Were the flag ignored,
        # every micro-batch would be synchronised, which check() counts
        # (24 passes, not 8); the sums alone would agree within tolerance.
        self.check(["--servers", "1", "--partition", "256B", "--credit", "1KB"], "flag", ["--accumulate-with", "flag"])

    def test_three_workers_against_the_exact_update(self):
        args = ["--model", "smooth", "--optimizer", "sgd", "--iterations", "6"]
        out = tmp("wrap-3.pt")
        run_ok(self, ["--workers", "3", "--servers", "2"], ["--backend", "autobyte-ddp", "--out", out] + args)
        got = torch.load(out)
        want = reference(self, args + ["--workers", "3"], tmp("wrap-3-ref.pt"))
        self.assertSameTraining(got, want, "wrapper, 3 workers, vs the exact update")
        self.assertRanksEqual(out, 3)
        self.assertMoved(got, "wrapper, 3 workers")


class GAN(unittest.TestCase):
    """Two models with an optimizer each (gan_worker.py), wrapped together
    or each in its own wrapper."""

    def check(self, launch_args, what, separate=False):
        out = tmp("gan-%s" % what)
        rc, output, _ = launch(["--workers", "3"] + launch_args, ["--out", out] + (["--separate"] if separate else []),
                               script=GAN_WORKER)
        self.assertEqual(rc, 0, output)
        got = [torch.load("%s.rank%d" % (out, r)) for r in range(3)]
        for r in (1, 2):
            self.assertTrue(torch.equal(got[0], got[r]), "%s: rank %d's parameters differ from rank 0's" % (what, r))
        want = torch.load(out + ".reference")
        self.assertLessEqual(rel(got[0], want), TOL, "%s: the GAN's parameters against the exact update" % what)
        initial = torch.cat([p.detach().reshape(-1) for p in gan_worker.make().parameters()])
        self.assertGreater(rel(want, initial), 1e-3, "training moved the parameters")

    def test_ps(self):
        self.check(["--servers", "2"], "ps")

    def test_allreduce(self):
        self.check(["--arch", "allreduce"], "allreduce")

    def test_a_wrapper_per_model(self):
        self.check(["--servers", "2"], "separate-ps", separate=True)
        self.check(["--arch", "allreduce"], "separate-allreduce", separate=True)


class CommHooks(unittest.TestCase):
    """DDP's compression hooks are autobyte's compression: a run with the
    hook equals, bit for bit, the same run with the launcher's
    --compression, and differs from the float32 run (so the comparison can
    fail)."""

    ARGS = ["--model", "smooth", "--optimizer", "sgd", "--iterations", "5"]

    def train(self, launch_args, hook, what):
        out = tmp("hook-%s.pt" % what)
        run_ok(self, ["--workers", "3"] + launch_args,
               ["--backend", "autobyte-ddp", "--out", out] + (["--comm-hook", hook] if hook else []) + self.ARGS)
        return torch.load(out), out

    def check(self, launch_args, hook, compression, what):
        got, out = self.train(launch_args, hook, what + "-hook")
        want, _ = self.train(launch_args + ["--compression", compression], None, what + "-flag")
        plain, _ = self.train(launch_args, None, what + "-float32")
        self.assertEqual(got["losses"], want["losses"], what)
        for k in want["state"]:
            self.assertTrue(torch.equal(got["state"][k], want["state"][k]), "%s: %s" % (what, k))
        self.assertFalse(all(torch.equal(got["state"][k], plain["state"][k]) for k in plain["state"]),
                         "%s: the hook's run equals the float32 run" % what)
        Compare.assertRanksEqual(self, out, 3)

    def test_bf16_hook_on_servers(self):
        self.check(["--servers", "2", "--partition", "256B", "--credit", "1KB"], "bf16", "bf16", "bf16-ps")

    def test_fp16_wrapper_on_the_ring(self):
        self.check(["--arch", "allreduce", "--partition", "256B", "--credit", "1KB"], "fp16-wrapper", "fp16", "fp16w-ring")

    def test_builtin_fp16_on_the_ring(self):
        got, _ = self.train(["--arch", "allreduce"], "builtin-fp16", "builtin-hook")
        want, _ = self.train(["--arch", "allreduce", "--compression", "fp16"], None, "builtin-flag")
        self.assertEqual(got["losses"], want["losses"])

    def tearDown(self):
        import autobyte.torch as ab
        ab.shutdown()
        ab._settings.pop("AUTOBYTE_COMPRESSION", None)

    def test_refusals(self):
        import autobyte.torch as ab
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        m = torch.nn.Linear(2, 2)

        def mine(state, bucket):
            return None
        w = ab.DistributedDataParallel(m)
        with self.assertRaisesRegex(ab.AutobyteError, r"register_comm_hook\(.*mine\): autobyte sums the gradients itself"):
            w.register_comm_hook(None, mine)
        with self.assertRaisesRegex(ab.AutobyteError, "register_comm_hook.*bf16_compress_wrapper.*autobyte sums"):
            w.register_comm_hook(None, default_hooks.bf16_compress_wrapper(mine))
        with self.assertRaisesRegex(ab.AutobyteError, r"register_builtin_comm_hook\('SPARSE'\): unknown hook type"):
            w.register_builtin_comm_hook("SPARSE")
        w.register_comm_hook(None, default_hooks.bf16_compress_hook)
        self.assertEqual(w._autobyte.layout.wire, ["bfloat16", "bfloat16"])
        with self.assertRaisesRegex(ab.AutobyteError, "a communication hook was registered already"):
            w.register_comm_hook(None, default_hooks.fp16_compress_hook)
        ab.shutdown()

        w = ab.DistributedDataParallel(m)
        w(torch.ones(1, 2)).sum().backward()
        with self.assertRaisesRegex(ab.AutobyteError, "register the hook before the first backward pass"):
            w.register_comm_hook(None, default_hooks.fp16_compress_hook)
        ab.shutdown()

        ab.init(compression="fp16")
        w = ab.DistributedDataParallel(m)
        with self.assertRaisesRegex(ab.AutobyteError, "means compression bf16, but init\(compression=...\) is 'fp16'"):
            w.register_comm_hook(None, default_hooks.bf16_compress_hook)
        w.register_comm_hook(None, default_hooks.fp16_compress_hook)  # the same: fine
        self.assertEqual(w._autobyte.layout.wire, ["float16", "float16"])


class JoinRefusals(unittest.TestCase):
    def tearDown(self):
        import autobyte.torch as ab
        ab.shutdown()
        ab._settings.pop("AUTOBYTE_COMPRESSION", None)

    def test_join_with_compression_is_refused(self):
        # join() ends with the last worker's parameters, which a bf16 wire
        # would round.
        import autobyte.torch as ab
        ab.init(compression="bf16")
        w = ab.DistributedDataParallel(torch.nn.Linear(2, 2))
        with self.assertRaisesRegex(ab.AutobyteError, "join\\(\\) with compression or float16 parameters"):
            with w.join():
                pass


class Arguments(unittest.TestCase):
    def test_grad_scaler_one_worker(self):
        # A GradScaler with float16 autocast over the wrapper, through a step
        # that overflows: plain torch's, bit for bit, the scale included.
        if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
            self.skipTest("torch %s has no CPU GradScaler" % torch.__version__)
        import autobyte.torch as ab

        def model():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        m1, m2 = model(), model()
        w = ab.DistributedDataParallel(m1)
        runs = []
        for net in (w, m2):
            runs.append((net, torch.optim.SGD(net.parameters(), lr=0.1), torch.amp.GradScaler("cpu", init_scale=2.0 ** 20)))
        g = torch.Generator().manual_seed(1)
        for k in range(5):
            x = torch.randn(5, 4, generator=g) * (1e4 if k == 2 else 1)
            for net, opt, scaler in runs:
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = net(x).float().pow(2).mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        self.assertLess(runs[1][2].get_scale(), 2.0 ** 20, "the step at k=2 overflowed and was skipped")
        self.assertEqual(runs[0][2].get_scale(), runs[1][2].get_scale())
        for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b), n)

    def tearDown(self):
        import autobyte.torch as ab
        ab.shutdown()

    def test_wrappers_share_a_session_and_release_it(self):
        # A wrapper per model (a GAN's generator and discriminator): the
        # second joins the first's session, which is closed and opened
        # again over both, and both wrappers then use the new one. Deleting
        # every wrapper releases it: the next wrapping closes it, even when a
        # wrapper is held in a reference cycle. A DistributedOptimizer
        # beside a wrapper is refused, naming the ways out; a comm hook or
        # join() on a shared session is refused too, and a model that cannot
        # be wrapped is refused before the open session is closed.
        import gc
        import autobyte.torch as ab
        torch.manual_seed(0)
        g, d = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
        G = ab.DistributedDataParallel(g)
        first = G._autobyte
        D = ab.DistributedDataParallel(d)
        self.assertTrue(first.closed, "the first wrapper's own session is still open")
        self.assertIs(G._autobyte, D._autobyte)
        shared = D._autobyte
        self.assertEqual(len(shared.params), 4)
        x = torch.randn(5, 4)
        D(G(x)).sum().backward()  # one worker: the gradients are plain torch's
        want_g, want_d = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
        want_g.load_state_dict(g.state_dict())
        want_d.load_state_dict(d.state_dict())
        want_d(want_g(x)).sum().backward()
        for a, b in zip(list(g.parameters()) + list(d.parameters()), list(want_g.parameters()) + list(want_d.parameters())):
            self.assertTrue(torch.equal(a.grad, b.grad))
        with self.assertRaisesRegex(ab.AutobyteError, "several DistributedDataParallel wrappers open"):
            G.register_comm_hook(None, _bf16_hook())
        with self.assertRaisesRegex(ab.AutobyteError, r"join\(\) with several DistributedDataParallel wrappers"):
            with D.join():
                pass
        with self.assertRaisesRegex(ab.AutobyteError, "already has a DistributedDataParallel open.*del model"):
            ab.DistributedOptimizer(torch.optim.SGD(g.parameters(), lr=0.1), g)
        with self.assertRaisesRegex(ab.AutobyteError, "has dtype torch.float64"):
            ab.DistributedDataParallel(torch.nn.Linear(2, 2).double())  # refused before the open session is touched
        self.assertFalse(shared.closed, "a refusal closed the open session")
        G.cycle = [G]  # collected only by the garbage collector
        del G, D
        gc.disable()  # the wrapping must collect the cycle itself
        try:
            third = ab.DistributedDataParallel(torch.nn.Sequential(g, torch.nn.Tanh(), d))
        finally:
            gc.enable()
        self.assertTrue(shared.closed, "the deleted wrappers' session is still open")
        self.assertEqual(third._autobyte.live_owners(), [third])
        third(x).sum().backward()
        self.assertIsNotNone(g.weight.grad)

    def test_refusals(self):
        import autobyte.torch as ab
        m = torch.nn.Linear(2, 2)
        for kw, want in [({"device_ids": [0]}, "(device_ids=[0]): autobyte trains on the CPU"),
                         ({"output_device": 1}, "(output_device=1)"),
                         ({"process_group": object()}, "torch.distributed is not initialised, so that group is none of "
                                                       "this job's"),
                         ({"mixed_precision": object()}, "unsupported argument(s) mixed_precision")]:
            with self.assertRaises(ab.AutobyteError) as cm:
                ab.DistributedDataParallel(m, **kw)
            self.assertIn(want, str(cm.exception))
        with self.assertRaisesRegex(ab.AutobyteError, "needs a torch.nn.Module, got str"):
            ab.DistributedDataParallel("model")
        # Names to ignore that name nothing (a typo would synchronise what
        # was meant to stay apart), and a bare string.
        net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        ab.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net[1], ["running_mean", "wieght"])
        with self.assertRaisesRegex(ab.AutobyteError, r"parameters and buffers to ignore 'wieght' are none of 1's "
                                    r"\(it has weight, bias, running_mean"):
            ab.DistributedDataParallel(net)
        ab.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net[1], "weight")
        with self.assertRaisesRegex(ab.AutobyteError, r"1._ddp_params_and_buffers_to_ignore is a string \('weight'\)"):
            ab.DistributedDataParallel(net)

    def test_one_worker_is_plain_training(self):
        # One worker: .grad after backward is the worker's own, so plain
        # torch's training, clipping included, bit for bit; the state dict
        # is DDP's ("module." prefix); join() is plain training too; a
        # second session refused.
        import autobyte.torch as ab
        torch.manual_seed(0)
        m1 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        torch.manual_seed(0)
        m2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        w = ab.DistributedDataParallel(m1, device_ids=None, broadcast_buffers=True, find_unused_parameters=True)
        self.assertIs(w.module, m1)
        w._set_static_graph()  # DDP's, which scripts with reentrant checkpointing call: nothing to do
        o1 = torch.optim.SGD(w.parameters(), lr=0.1, momentum=0.9)
        o2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(5, 4, generator=g)
            for net, o, params in ((w, o1, m1.parameters()), (m2, o2, m2.parameters())):
                o.zero_grad()
                net(x).pow(2).mean().backward()
                torch.nn.utils.clip_grad_norm_(list(params), 0.1)
                o.step()
        for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b), n)
        self.assertEqual(list(w.state_dict())[0], "module.0.weight")
        # join() with one worker: plain training too.
        with w.join():
            for _ in range(2):
                x = torch.randn(5, 4, generator=g)
                for net, o in ((w, o1), (m2, o2)):
                    o.zero_grad()
                    net(x).pow(2).mean().backward()
                    o.step()
        for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b), n)
        for kw, want in [({"throw_on_early_termination": "yes"}, r"join\(throw_on_early_termination='yes'\): want True or False"),
                         ({"enable": 1}, r"join\(enable=1\): want True or False")]:
            with self.assertRaisesRegex(ab.AutobyteError, want):
                with w.join(**kw):
                    pass
        with w.join(throw_on_early_termination=True):  # one worker: nobody runs out before it
            o1.zero_grad()
            w(torch.randn(5, 4)).pow(2).mean().backward()
        with self.assertRaisesRegex(ab.AutobyteError, "already has a DistributedDataParallel open.*delete its DistributedDataParallel"):
            ab.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), m2)


def _bf16_hook():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook


if __name__ == "__main__":
    unittest.main()
