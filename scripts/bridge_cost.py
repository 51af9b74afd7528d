"""Cost of the Python-Go bridge per MB of gradient (one process, one worker:
no network, so what remains is the plugin's own work).

    PYTHONPATH=python /usr/bin/python3 scripts/bridge_cost.py

For each gradient size it times (median of --reps) the bridge's two parts:
the copy into the engine's buffer (torch.div out=, the one copy on the way
in; the sum comes back in place) and one post + wait round trip through
ctypes and the Go engine (scheduling, partitioning, the layer gate). Prints
a table and one JSON line.
"""

import argparse
import json
import statistics
import sys
import time

import torch

from autobyte._native import Engine


def median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="1,4,16,64")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sizes = [int(x) for x in a.sizes_mb.split(",")]
    rows = []
    # The raw bridge: one engine session (one tensor) per size.
    for mb in sizes:
        n = mb * (1 << 20) // 4
        eng = Engine([{"name": "g", "layer": 0, "elems": n}])
        buf, grad = torch.zeros(n), torch.randn(n)
        copy = median_time(lambda: torch.div(grad, 3, out=buf), a.reps)
        it = [0]

        def roundtrip():
            eng.post(0, it[0], buf.data_ptr(), n)
            eng.wait_layer(0, it[0])
            it[0] += 1

        rt = median_time(roundtrip, a.reps)
        eng.close()
        rows.append({"mb": mb, "copy_in_ms": copy * 1e3, "post_wait_ms": rt * 1e3})
    print("%6s %12s %14s %12s" % ("MB", "copy-in ms", "post+wait ms", "ms per MB"))
    for r in rows:
        r["per_mb_ms"] = (r["copy_in_ms"] + r["post_wait_ms"]) / r["mb"]
        print("%6d %12.3f %14.3f %12.4f" % (r["mb"], r["copy_in_ms"], r["post_wait_ms"], r["per_mb_ms"]))
    print(json.dumps({"bridge": rows}))


if __name__ == "__main__":
    sys.exit(main())
