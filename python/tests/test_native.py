"""The engine's C calls (python/autobyte/_native.py over libautobyte.so)
in one process: posting through the queue the engine drains, waiting for
layers and runs of layers, and every bad argument refused with its value."""

import ctypes
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from autobyte import AutobyteError  # noqa: E402
from autobyte._native import Engine  # noqa: E402

# One worker: no peers, the sum is the worker's own gradient (averaged by
# the caller, so the engine's sum returns it unchanged).
TENSORS = [
    {"name": "a", "layer": 0, "elems": 5},
    {"name": "b", "layer": 0, "elems": 3},
    {"name": "c", "layer": 1, "elems": 7},
    {"name": "d", "layer": 2, "elems": 2},
]
SETTINGS = {"RANK": "0", "WORLD_SIZE": "1", "AUTOBYTE_ARCH": "allreduce"}


def buffers():
    return [(ctypes.c_float * t["elems"])(*[float(i + 1) for i in range(t["elems"])]) for t in TENSORS]


class Native(unittest.TestCase):
    def setUp(self):
        self.engine = Engine(TENSORS, SETTINGS)

    def tearDown(self):
        self.engine.close()

    def post(self, bufs, tensors, iteration):
        for t in tensors:
            self.engine.post(t, iteration, ctypes.addressof(bufs[t]), len(bufs[t]))

    def wait_all(self, iteration):
        # wait_run waits for its first layer only: the others' sums may
        # still be on their way.
        for layer in (2, 1):
            self.engine.wait_layer(layer, iteration)
        self.assertEqual(self.engine.wait_run(0, iteration), 3)

    def test_runs_of_layers(self):
        bufs = buffers()
        # Layers 0 and 2 complete; layer 1 does not: the run from 0 is 1
        # layer long, from 2 it is 1 (the last layer).
        self.post(bufs, [0, 1, 3], 0)
        self.assertEqual(self.engine.wait_run(0, 0), 1)
        self.assertEqual(self.engine.wait_run(2, 0), 1)
        self.post(bufs, [2], 0)
        self.engine.wait_layer(1, 0)
        self.assertEqual(self.engine.wait_run(0, 0), 3)
        self.assertEqual(self.engine.wait_run(1, 0), 2)
        # The sum over one worker is the gradient itself.
        for b in bufs:
            self.assertEqual(list(b), [float(i + 1) for i in range(len(b))])
        # The next iteration, posted in one burst, out of order.
        self.post(bufs, [3, 2, 1, 0], 1)
        self.wait_all(1)

    def test_wait_timeout(self):
        # A layer nobody posts: the wait ends after AUTOBYTE_TIMEOUT with an
        # error saying what it waited for, and the engine still works.
        self.engine.close()
        self.engine = Engine(TENSORS, dict(SETTINGS, AUTOBYTE_TIMEOUT="0.3s"))
        bufs = buffers()
        self.post(bufs, [0, 1, 3], 0)
        t0 = time.monotonic()
        with self.assertRaisesRegex(AutobyteError, r"waited 0\.[0-9] s for the sums of layer 1 of iteration 0 \(the last in place: -1\): "
                                    r"a worker has not posted its gradients.*AUTOBYTE_TIMEOUT"):
            self.engine.wait_layer(1, 0)
        waited = time.monotonic() - t0
        self.assertGreaterEqual(waited, 0.25)
        self.assertLess(waited, 5)
        self.assertEqual(self.engine.wait_run(2, 0), 1)  # a layer in place does not wait
        self.post(bufs, [2], 0)
        self.engine.wait_layer(1, 0)

    def test_bad_posts(self):
        bufs = buffers()
        a = ctypes.addressof(bufs[0])
        for args, message in (
                ((4, 0, a, 5), r"ab_post: tensor 4 out of range \(have 4\)"),
                ((-1, 0, a, 5), r"ab_post: tensor -1 out of range"),
                ((0, 0, a, 6), r"ab_post: tensor 0: gradient has 6 elements, want 5"),
                ((0, -2, a, 5), r"ab_post: tensor 0: iteration -2 < 0"),
                ((0, 0, None, 5), r"ab_post: tensor 0: no data")):
            with self.assertRaisesRegex(AutobyteError, message):
                self.engine.post(*args)
        for layer in (3, -1):
            with self.assertRaisesRegex(AutobyteError, r"ab_wait_layer: layer %d out of range \(have 3\)" % layer):
                self.engine.wait_run(layer, 0)
        # Refused posts queued nothing: the job still runs.
        self.post(bufs, [0, 1, 2, 3], 0)
        self.wait_all(0)

    def test_after_close(self):
        self.engine.close()
        with self.assertRaisesRegex(AutobyteError, r"no session"):
            self.engine._check(self.engine._lib.ab_post(0, 0, None, 5))
        with self.assertRaisesRegex(AutobyteError, r"no session"):
            self.engine._check(self.engine._lib.ab_wait_layer(0, 0))
        # A second session in the same process works.
        self.engine = Engine(TENSORS, SETTINGS)
        bufs = buffers()
        self.post(bufs, [0, 1, 2, 3], 0)
        self.wait_all(0)

    def test_engine_error_reaches_the_poster(self):
        bufs = buffers()
        self.post(bufs, [0, 1, 2, 3], 0)
        self.engine.wait_run(0, 0)
        # The same tensor of the same iteration twice: the engine (not the
        # C queue) refuses it and stops, and the next call says why.
        self.post(bufs, [0], 0)
        with self.assertRaisesRegex(AutobyteError, r"tensor 0 iteration 0 posted twice"):
            self.engine.wait_run(0, 1)
        with self.assertRaisesRegex(AutobyteError, r"tensor 0 iteration 0 posted twice"):
            self.post(bufs, [1], 1)
        self.engine.close(ok=False)


if __name__ == "__main__":
    unittest.main()
