"""Uneven inputs: DistributedOptimizer(..., uneven_inputs=True) and
optimizer.join() (join_worker.py).

Workers train different numbers of steps (one none at all); those that
run out first step along with zero gradients. Every worker must end with
the same parameters and optimizer state, bit for bit, and those of the
exact update in one process (the active workers' gradients over the
number of workers, as DDP's Join divides). The learning rate changes every
step (LambdaLR), so a joined worker that applied its own, stale rate would
end apart from the others: the test checks that the rate did change while
a worker had joined, which the bit-for-bit comparison then covers.
"""

import os
import subprocess
import unittest

import torch

from helpers import Compare, PY, ROOT, launch, rel, tmp

JOIN_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "join_worker.py")
STEPS = "3,7,0"  # rank 2 has no inputs at all
WORKERS = 3


def reference(out, steps=STEPS, extra=()):
    r = subprocess.run([PY, JOIN_WORKER, "--backend", "reference", "--steps", steps, "--workers", str(WORKERS),
                        "--out", out] + list(extra), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    return torch.load(out)["state"]


class Join(unittest.TestCase, Compare):
    def run_job(self, arch, mode="ok"):
        out = tmp("join-%s-%s" % (arch.replace(" ", ""), mode))
        args = ["--workers", str(WORKERS)] + (["--servers", "2"] if arch == "ps" else ["--arch", "allreduce"])
        rc, output, _ = launch(args, ["--backend", "autobyte", "--steps", STEPS, "--mode", mode, "--out", out],
                               script=JOIN_WORKER, timeout=180)
        return rc, output, out

    def check_even(self, arch):
        rc, output, out = self.run_job(arch)
        self.assertEqual(rc, 0, output)
        got = [torch.load("%s.rank%d" % (out, r)) for r in range(WORKERS)]
        want = reference(tmp("join-reference"))
        self.assertEqual(sorted(got[0]["state"]), sorted(want), "the same parameters and optimizer state")
        for r in range(1, WORKERS):
            for k, v in got[0]["state"].items():
                self.assertTrue(torch.equal(v, got[r]["state"][k]), "%s: rank %d's %s differs from rank 0's" % (arch, r, k))
        for k, v in got[0]["state"].items():
            self.assertLessEqual(rel(v, want[k]), 1e-5, "%s: %s differs from the exact update" % (arch, k))
        # Rank 0 joined after 3 steps, rank 1 trained 7: the rate changed
        # while rank 0 had joined, and rank 0's own rate stayed where it
        # was (its scheduler stepped only while it trained).
        self.assertEqual(len(got[0]["lrs"]), 3)
        self.assertEqual(len(got[1]["lrs"]), 7)
        self.assertNotEqual(got[0]["lr_after_join"], got[1]["lr_after_join"])
        self.assertEqual(got[2]["lrs"], [])
        # The parameters moved after rank 0 and rank 2 joined: the exact
        # update of 3 steps is not the result.
        early = reference(tmp("join-reference-3"), "3,3,0")
        self.assertGreater(max(rel(v, early[k]) for k, v in got[0]["state"].items()), 1e-3,
                           "the joined ranks applied the later steps' updates")

    def test_ps(self):
        self.check_even("ps")

    def test_allreduce(self):
        self.check_even("allreduce")

    def test_sync_gradients_while_joined_is_refused(self):
        rc, output, _ = self.run_job("ps", "synced")
        self.assertNotEqual(rc, 0, output)
        self.assertIn("worker 1 called optimizer.sync_gradients() in step 4 while worker", output)
        self.assertIn("had joined", output)

    def test_exception_inside_join_ends_the_job(self):
        rc, output, _ = self.run_job("allreduce", "raise")
        self.assertNotEqual(rc, 0, output)
        self.assertIn("rank 1 fails inside join()", output)

    def test_join_needs_uneven_inputs(self):
        rc, output, _ = self.run_job("allreduce", "no-flag")
        self.assertNotEqual(rc, 0, output)
        self.assertIn("optimizer.join() needs DistributedOptimizer(..., uneven_inputs=True)", output)


class WrapperJoin(unittest.TestCase):
    """DistributedDataParallel.join(), DDP's: the joined workers' optimizers
    do not step, and at the end every worker takes the parameters of the
    highest-ranked worker among the last to train. So every worker ends with
    the exact update's parameters (the last worker's optimizer took every
    step), bit for bit the same on every worker, and, with 2 workers (a + b
    or a + 0 in any order), bit for bit DDP's on gloo."""

    def run_job(self, backend, launch_args, steps, workers, extra=()):
        out = tmp("wjoin-%s-%s-%s-%s" % (backend, "".join(launch_args).replace("-", ""), "".join(extra), steps))
        rc, output, _ = launch(["--workers", str(workers)] + launch_args,
                               ["--backend", backend, "--steps", steps, "--out", out] + list(extra),
                               script=JOIN_WORKER, timeout=180)
        self.assertEqual(rc, 0, output)
        results = [torch.load("%s.rank%d" % (out, r)) for r in range(workers)]
        got = [res["state"] for res in results]
        for r in range(1, workers):
            for k, v in got[0].items():
                self.assertTrue(torch.equal(v, got[r][k]), "rank %d's %s differs from rank 0's" % (r, k))
        self.raised = [res.get("raised") for res in results]
        return got[0]

    def check_exact(self, launch_args, extra=()):
        got = self.run_job("autobyte-ddp", launch_args, STEPS, WORKERS, extra)
        want = reference(tmp("wjoin-reference" + "".join(extra)), extra=extra)
        for k, v in got.items():
            self.assertLessEqual(rel(v, want[k]), 1e-5, "%s differs from the exact update" % k)
        return got

    def test_ps(self):
        got = self.check_exact(["--servers", "2", "--partition", "256B", "--credit", "1KB"])
        # The parameters moved after ranks 0 and 2 joined: 3 steps' update
        # is not the result.
        early = reference(tmp("wjoin-reference-3"), "3,3,0")
        self.assertGreater(max(rel(v, early[k]) for k, v in got.items()), 1e-3)

    def test_allreduce_divided_by_the_active_workers(self):
        got = self.check_exact(["--arch", "allreduce"], ["--divide-by-active"])
        by_world = reference(tmp("wjoin-reference"))
        self.assertGreater(max(rel(v, by_world[k]) for k, v in got.items()), 1e-4,
                           "dividing by the active workers made no difference: the check could not fail")

    def test_against_ddp(self):
        want = self.run_job("ddp", ["--arch", "allreduce"], "3,6", 2)
        for launch_args in (["--servers", "1"], ["--arch", "allreduce", "--partition", "256B", "--credit", "1KB"]):
            got = self.run_job("autobyte-ddp", launch_args, "3,6", 2)
            for k, v in want.items():
                self.assertTrue(torch.equal(got[k], v), "%s: %s differs from DDP's (%.1e)" % (launch_args, k, rel(got[k], v)))


    def test_throw_on_early_termination(self):
        # Every worker raises in the first pass in which one has run out,
        # before any optimizer steps: all keep the 3 steps every worker
        # took. With 2 workers, bit for bit DDP's; with 3, the exact update
        # of 3 steps on every worker; without throwing (the control) the
        # workers go on and end elsewhere.
        throw = ["--throw"]
        want = self.run_job("ddp", ["--arch", "allreduce"], "3,6", 2, throw)
        self.assertTrue(all(self.raised), "DDP did not throw on every rank: %s" % self.raised)
        got = self.run_job("autobyte-ddp", ["--servers", "1"], "3,6", 2, throw)
        self.assertTrue(all(self.raised), "not every worker raised: %s" % self.raised)
        self.assertIn("Rank 0 exhausted all inputs. (", self.raised[0])
        self.assertIn("Detected at least one rank that exhausted inputs. Throwing across all ranks. (", self.raised[1])
        self.assertIn("worker 0 ran out of inputs before step 3, which no worker takes", self.raised[1])
        for k, v in want.items():
            self.assertTrue(torch.equal(got[k], v), "%s differs from DDP's (%.1e)" % (k, rel(got[k], v)))
        got = self.run_job("autobyte-ddp", ["--arch", "allreduce"], "3,7,5", 3, throw)
        self.assertTrue(all(self.raised), "not every worker raised: %s" % self.raised)
        three = reference(tmp("wjoin-reference-333"), "3,3,3")
        for k, v in got.items():
            self.assertLessEqual(rel(v, three[k]), 1e-5, "%s differs from the exact update of 3 steps" % k)
        went_on = self.run_job("autobyte-ddp", ["--arch", "allreduce"], "3,7,5", 3)
        self.assertEqual(self.raised, [None] * 3)
        self.assertGreater(max(rel(v, three[k]) for k, v in went_on.items()), 1e-3,
                           "the workers that did not throw ended at 3 steps too: the check could not fail")


class Arguments(unittest.TestCase):
    def tearDown(self):
        import autobyte.torch as ab
        ab.shutdown()

    def test_uneven_inputs_must_be_a_bool(self):
        import autobyte.torch as ab
        m = torch.nn.Linear(2, 2)
        with self.assertRaisesRegex(ab.AutobyteError, "uneven_inputs must be True or False, got 'yes'"):
            ab.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, uneven_inputs="yes")

    def test_one_worker_join_is_plain_training(self):
        # One worker: join() adds nothing, and the result is plain torch's.
        import autobyte.torch as ab
        import join_worker as jw
        m1, m2 = jw.make_model(), jw.make_model()
        o1, s1 = jw.make_opt(m1.parameters())
        o1 = ab.DistributedOptimizer(o1, m1, uneven_inputs=True)
        o2, s2 = jw.make_opt(m2.parameters())
        with o1.join():
            for k in range(4):
                for m, o, s in ((m1, o1, s1), (m2, o2, s2)):
                    x, y = jw.batch(0, k)
                    o.zero_grad()
                    jw.loss_of(m, x, y).backward()
                    o.step()
                    s.step()
        o1.synchronize()
        for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b), n)
        with self.assertRaisesRegex(ab.AutobyteError, "inside optimizer.join"):
            with o1.join():
                with o1.join():
                    pass


if __name__ == "__main__":
    unittest.main()
