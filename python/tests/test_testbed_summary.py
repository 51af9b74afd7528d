"""scripts/testbed_summary.py, the summary the testbed scripts print, on
runs written here (the testbed itself needs root and minutes)."""
import importlib.util
import json
import os
import tempfile
import unittest

_path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "testbed_summary.py")
_spec = importlib.util.spec_from_file_location("testbed_summary", _path)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)


def write(d, name, mean, verified=True, configs=()):
    with open(os.path.join(d, name), "w") as f:
        json.dump({"mean_iteration_time_s": mean, "verified": verified, "configs": list(configs)}, f)


class TestbedSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = self.dir.name
        # autobyte 1.0 / 1.2 / 1.1 (median 1.1); static A 2.0 / 1.9 / 2.2
        # (median 2.0, the best static); static B 3, 3, 3 with one run
        # unverified.
        for r, m in enumerate([1.0, 1.2, 1.1], 1):
            write(d, "autobyte-%d.json" % r, m, configs=[{"from_iteration": 0, "partition_bytes": 4e6, "credit_bytes": 16e6},
                                                      {"from_iteration": 42, "partition_bytes": 262144, "credit_bytes": 106.5e6, "server_weights": [1000, 250, 1000]}])
        for r, m in enumerate([2.0, 1.9, 2.2], 1):
            write(d, "262144-106500000-1000-250-1000-%d.json" % r, m)
        for r in range(1, 4):
            write(d, "4MB-16MB-%d.json" % r, 3.0, verified=r != 2)
        write(d, "autobyte-sim.json", 1.0)
        write(d, "262144-106500000-1000-250-1000-sim.json", 2.5)
        write(d, "4MB-16MB-sim.json", 3.0)
        self.runs = ["autobyte", "262144:106500000:1000:250:1000", "4MB:16MB"]

    def test_table(self):
        out = summary.table(self.dir.name, 3, self.runs)
        rows = {l.split(" | ")[0].lstrip("| "): l for l in out.splitlines() if l.startswith("| ") and "---" not in l}
        self.assertIn("| autobyte | 1.100 s | -45.0% | True | 1.000, 1.200, 1.100 |", out)
        self.assertIn("| static 0.2621 MB / 106.5 MB, weights 1000:250:1000 | 2.000 s | +0.0% | True |", out)
        self.assertIn("| static 4MB / 16MB | 3.000 s | +50.0% | False |", out)
        self.assertTrue(out.endswith("best static measured: 262144:106500000:1000:250:1000"))
        self.assertNotIn("simulated", rows["run"])

    def test_table_with_simulation(self):
        out = summary.table(self.dir.name, 3, self.runs, sim=True)
        self.assertIn("| run | mean iteration (median of 3) | vs best static measured | simulated | measured vs simulated | verified | runs |", out)
        self.assertIn("| autobyte | 1.100 s | -45.0% | 1.000 s | +10.0% | True |", out)
        self.assertIn("| 2.000 s | +0.0% | 2.500 s | -20.0% |", out)

    def test_run_line(self):
        line = summary.run_line(os.path.join(self.dir.name, "autobyte-1.json"), "autobyte")
        self.assertEqual(line.split("  configs ")[1], "0:4/16 MB; 42:0.262144/106.5 MB w1000:250:1000")
        self.assertIn("mean 1.000 s  verified True", line)

    def test_bad_input(self):
        with self.assertRaisesRegex(SystemExit, "missing-1.json"):
            summary.table(self.dir.name, 3, ["autobyte", "missing"])
        with self.assertRaisesRegex(SystemExit, "no static run"):
            summary.table(self.dir.name, 3, ["autobyte"])
        with self.assertRaisesRegex(SystemExit, "REPEATS must be a whole number, got 'x'"):
            summary.main(["table", self.dir.name, "x", "autobyte"])
        with self.assertRaisesRegex(SystemExit, "'oops': want autobyte or PARTITION:CREDIT"):
            summary.name("oops")


if __name__ == "__main__":
    unittest.main()
