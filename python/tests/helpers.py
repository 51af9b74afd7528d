"""Shared by the plugin's tests: running dp_worker.py under the launcher,
the exact reference, and comparisons.

Multi-worker runs go through the real launcher (`autobyte launch -- ...`):
parameter servers and workers are separate processes on loopback TCP.
$AUTOBYTE_BIN names the autobyte binary; otherwise it is built from this
checkout once per test run.
"""

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

WORKER = os.path.join(HERE, "dp_worker.py")
PY = sys.executable
TOL = 1e-5
TMP = tempfile.mkdtemp(prefix="autobyte-torch-test-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
_bin = None


def tmp(name):
    return os.path.join(TMP, name)


def master_port():
    """A MASTER_PORT as torchrun's users pick one: below the kernel's
    ephemeral range (torchrun's default is 29500), with nothing listening at
    it or at the port after it, where autobyte's rank 0 listens.

    A port from bind(("", 0)) would lie inside the ephemeral range, where
    the next one can be taken at any moment by an outgoing connection's
    local port (torchrun's own clients of its store at MASTER_PORT, for one),
    and rank 0 would fail with "address already in use"; cluster.FreePort
    picks the launcher's ports below the range for the same reason."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, low - 1) if low > 21000 else rng.randrange(10000, 19999)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("", port))
                b.bind(("", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports below the ephemeral range (from %d)" % low)


def autobyte_bin():
    global _bin
    if _bin is None:
        _bin = os.environ.get("AUTOBYTE_BIN")
        if not _bin:
            _bin = tmp("autobyte")
            go = shutil.which("go") or "/usr/local/go/bin/go"
            subprocess.run([go, "build", "-o", _bin, "./cmd/autobyte"], cwd=ROOT, check=True)
    return _bin


def launch(launch_args, worker_args, timeout=180, script=WORKER):
    """Runs script under `autobyte launch`; returns (rc, output, seconds).

    A job still running after timeout seconds is a hang: its processes are
    sent SIGABRT, on which Python (PYTHONFAULTHANDLER) prints every
    thread's stack and Go (GOTRACEBACK=all) every goroutine's, the launcher
    reports them, and the test fails with that output."""
    cmd = [autobyte_bin(), "launch"] + launch_args + ["--", PY, script] + worker_args
    env = dict(os.environ, PYTHONFAULTHANDLER="1", GOTRACEBACK="all")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = _descendants(p.pid)
        for pid in hung:
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        raise AssertionError("autobyte launch %s -- %s %s still ran after %d s; its %d processes were sent SIGABRT "
                             "to show where they were:\n%s" % (" ".join(launch_args), os.path.basename(script),
                                                                 " ".join(worker_args), timeout, len(hung), out[-30000:]))
    return p.returncode, out, time.monotonic() - t0


def _descendants(pid):
    """The processes below pid (from /proc), children first."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def run_ok(test, launch_args, worker_args, script=WORKER, timeout=180):
    rc, out, _ = launch(launch_args, worker_args, script=script, timeout=timeout)
    test.assertEqual(rc, 0, "launch %s -- %s %s failed:\n%s" % (launch_args, os.path.basename(script), worker_args, out))
    return out


_references = {}


def reference(test, worker_args, out):
    """The exact update (dp_worker --backend reference), run once per set of
    arguments: it is deterministic, and a process costs seconds of startup."""
    key = tuple(worker_args)
    if key not in _references:
        r = subprocess.run([PY, WORKER, "--backend", "reference", "--out", out] + worker_args, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        test.assertEqual(r.returncode, 0, r.stdout)
        _references[key] = torch.load(out)
    return _references[key]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def worst(got, want, keys=None):
    """(worst relative loss difference, worst relative L2 difference of a
    tensor, that tensor's name) between two dp_worker results."""
    lg, lw = torch.tensor(got["losses"]), torch.tensor(want["losses"])
    wl = ((lg - lw).abs() / lw.abs()).max().item() if len(lw) else 0.0
    wp, wk = 0.0, None
    for k in keys or got["state"]:
        r = rel(got["state"][k], want["state"][k])
        if wk is None or r > wp:
            wp, wk = r, k
    return wl, wp, wk


class Compare:
    def assertSameTraining(self, got, want, what, params_only=None, tol=TOL, slack=None):
        """Losses and parameters agree within tol relative; slack (a
        dp_worker result) widens each bound by that result's own distance
        from want, for a comparison with a run that rounds differently."""
        lg, lw = torch.tensor(got["losses"]), torch.tensor(want["losses"])
        self.assertEqual(len(lg), len(lw), "%s: %d steps vs %d" % (what, len(lg), len(lw)))
        loss_tol = tol
        if slack is not None:
            ls = torch.tensor(slack["losses"])
            loss_tol += ((ls - lw).abs() / lw.abs()).max().item()
        worst_loss = ((lg - lw).abs() / lw.abs()).max().item()
        self.assertLessEqual(worst_loss, loss_tol, "%s: losses differ by %.2e relative (bound %.2e):\n%s\n%s"
                             % (what, worst_loss, loss_tol, lg, lw))
        self.assertEqual(sorted(got["state"]), sorted(want["state"]), what)
        for k, v in got["state"].items():
            if params_only is not None and k not in params_only:
                continue
            bound = tol + (rel(slack["state"][k], want["state"][k]) if slack is not None else 0.0)
            r = rel(v, want["state"][k])
            self.assertLessEqual(r, bound, "%s: parameter %s differs by %.2e relative (bound %.2e)" % (what, k, r, bound))

    def assertRanksEqual(self, out, workers, keys=None):
        base = torch.load(out)["state"]
        for r in range(1, workers):
            other = torch.load("%s.rank%d" % (out, r))["state"]
            for k in keys or base:
                self.assertTrue(torch.equal(base[k], other[k]), "rank %d's %s differs from rank 0's" % (r, k))

    def assertMoved(self, got, what):
        # Training moved the parameters: the comparison is not vacuous.
        self.assertGreater(abs(got["losses"][0] - got["losses"][-1]), 1e-4,
                           "%s: the loss did not move: %s" % (what, got["losses"]))
