"""Bit-reproducible plugin runs (run: /usr/bin/python3 -m unittest discover -s python/tests -p 'test_determinism.py' -v).

Parameter servers sum each piece in rank order whatever order the pushes
arrive in, and ring all-reduce in the ring's fixed order, so the same job
run twice gives the same bits: losses and parameters, not merely close
ones. The job runs through the real launcher
(`autobyte launch -- ...`) as separate processes on loopback TCP, where
arrival order varies from run to run. $AUTOBYTE_BIN names the autobyte
binary; otherwise it is built from this checkout once per run.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "dp_worker.py")
PY = sys.executable
WORKERS = 4  # from 3 workers on, the order of a sum changes its bits
_tmp = tempfile.mkdtemp(prefix="autobyte-determinism-test-")
_bin = None


def autobyte_bin():
    global _bin
    if _bin is None:
        _bin = os.environ.get("AUTOBYTE_BIN")
        if not _bin:
            _bin = os.path.join(_tmp, "autobyte")
            go = shutil.which("go") or "/usr/local/go/bin/go"
            subprocess.run([go, "build", "-o", _bin, "./cmd/autobyte"], cwd=ROOT, check=True)
    return _bin


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def tearDownModule():
    shutil.rmtree(_tmp, ignore_errors=True)


class Determinism(unittest.TestCase):
    """4 workers, 4 KB pieces under a 16 KB credit window (many pieces in
    flight, so frames arrive in varying orders), SGD with momentum for 20
    steps, on 2 parameter servers and on ring all-reduce."""

    ARGS = ["--model", "smooth", "--optimizer", "sgd", "--iterations", "20"]

    def run_job(self, name, launch_args):
        out = os.path.join(_tmp, name + ".pt")
        cmd = [autobyte_bin(), "launch", "--workers", str(WORKERS)] + launch_args + \
              ["--", PY, WORKER, "--backend", "autobyte", "--out", out] + self.ARGS
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
        self.assertEqual(r.returncode, 0, "%s failed:\n%s" % (" ".join(cmd), r.stdout))
        got = torch.load(out)
        got["output"] = r.stdout
        for rank in range(1, WORKERS):
            other = torch.load("%s.rank%d" % (out, rank))["state"]
            for k, v in got["state"].items():
                self.assertTrue(torch.equal(v, other[k]), "%s: rank %d's %s differs from rank 0's" % (name, rank, k))
        return got

    def assertSameBits(self, a, b, what):
        la, lb = torch.tensor(a["losses"]), torch.tensor(b["losses"])
        self.assertEqual(len(la), len(lb))
        differ = [(i, x, y) for i, (x, y) in enumerate(zip(a["losses"], b["losses"])) if x != y]
        self.assertEqual(differ, [], "%s: losses differ at steps (step, first, second) %s" % (what, differ[:5]))
        for k, v in a["state"].items():
            w = b["state"][k]
            self.assertTrue(torch.equal(v, w), "%s: parameter %s differs, by up to %.3e" % (what, k, (v - w).abs().max().item()))

    PS = ["--servers", "2", "--partition", "4KB", "--credit", "16KB"]
    RING = ["--arch", "allreduce", "--partition", "4KB", "--credit", "16KB"]
    _runs = {}

    def job(self, name, launch_args):
        """Runs a job once per test run: the control below reuses it."""
        if name not in self._runs:
            self._runs[name] = self.run_job(name, launch_args)
        return self._runs[name]

    def test_parameter_servers_twice(self):
        first, second = self.job("ps-1", self.PS), self.job("ps-2", self.PS)
        self.assertSameBits(first, second, "two runs of the same job on parameter servers")
        # Training moved the parameters (the comparison is not of a job
        # that does nothing).
        self.assertGreater(abs(first["losses"][0] - first["losses"][-1]), 1e-3)

    def test_ring_allreduce_twice(self):
        self.assertSameBits(self.job("ring-1", self.RING), self.job("ring-2", self.RING),
                            "two runs of the same job on ring all-reduce")

    def test_fusion_keeps_the_servers_sums(self):
        # Fused small parameters travel as one piece, but a server still
        # sums each element in rank order: the same bits as unfused.
        self.assertSameBits(self.job("ps-1", self.PS), self.job("ps-fused", self.PS + ["--fusion", "64KB"]),
                            "parameter servers with and without --fusion 64KB")

    def test_server_weights_keep_the_servers_sums(self):
        # Weights move pieces between the servers; whichever server holds a
        # piece sums it in rank order: the same bits as even placement.
        weighted = self.job("ps-weighted", self.PS + ["--server-weights", "1:5", "--log-level", "info"])
        self.assertSameBits(self.job("ps-1", self.PS), weighted, "parameter servers with even weights and with --server-weights 1:5")
        # The weights did move the bytes (the servers log what they received).
        got = dict(re.findall(r"server finished a job.* server=(\d) .*bytes_received=(\d+)", weighted["output"]))
        self.assertEqual(sorted(got), ["0", "1"], "the servers' byte counts in:\n%s" % weighted["output"])
        self.assertGreater(int(got["1"]), 3 * int(got["0"]), "server 1 (weight 5) received %s bytes, server 0 (weight 1) %s" % (got["1"], got["0"]))

    def test_fusion_on_the_ring(self):
        # Fusion moves the ring's chunk boundaries, so the order of some
        # sums changes: the same training within rounding.
        ring, fused = self.job("ring-1", self.RING), self.job("ring-fused", self.RING + ["--fusion", "64KB"])
        for k, v in ring["state"].items():
            self.assertLess(rel(fused["state"][k], v), 1e-5, "ring with --fusion 64KB: parameter %s" % k)
        for a, b in zip(ring["losses"], fused["losses"]):
            self.assertLess(abs(a - b), 1e-5 * abs(b), "ring with --fusion 64KB: losses %s vs %s" % (fused["losses"], ring["losses"]))

    def test_control_other_order_is_seen(self):
        # Negative control: ring all-reduce sums in another (fixed) order
        # than the servers, and the bitwise comparison tells the two apart,
        # so a change of summation order cannot pass unnoticed.
        ps, ring = self.job("ps-1", self.PS), self.job("ring-1", self.RING)
        differ = [k for k, v in ps["state"].items() if not torch.equal(v, ring["state"][k])]
        self.assertNotEqual(differ, [], "ring all-reduce gave the parameter servers' bits exactly: the check cannot see a change of summation order")
        print("\n  ring vs parameter servers: %d of %d tensors differ in some bit" % (len(differ), len(ps["state"])), file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
