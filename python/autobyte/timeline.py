"""Timelines of the plugin's training steps, and their summary.

With ``AUTOBYTE_TRACE=FILE`` (``autobyte launch --trace DIR`` sets
``DIR/rank-N.json``), each worker streams a Chrome trace (chrome://tracing,
Perfetto) of what its training thread did:

* ``forward`` spans: the model's forward pass (the first of each step),
  including the time it was blocked on layer gates;
* ``backward`` spans: from the first gradient autograd produced to the end
  of the backward pass;
* ``wait layer N`` spans, nested in the forward: how long the module of
  layer N waited for its parameters' sums (``layers``: N and the layers
  after it whose sums were in already, updated with it);
* ``post`` instants: each gradient handed to the engine.

Beside it, the Go engine writes ``engine-NAME``: each piece's QUEUE (posted
to started: waiting for its turn and for credit) and COMMUNICATION (started
to sum in place) phases, in the same clock.

Times come from ``time.perf_counter`` (CLOCK_MONOTONIC on Linux), so the
timelines of workers on one machine (the testbed, loopback) share a clock
and can be compared; across machines they cannot.

``python -m autobyte.timeline DIR|FILE...`` summarises them: per worker,
the median step, forward, backward and waits (per layer); across workers,
the median time from the last worker posting layer 0's gradient to the
first waiting worker receiving its sum, the part of a step that the network
and the servers add on the critical path; with the engine's timelines, how
much of it that worker's layer 0 pieces spent queued and how much in flight.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time

from . import AutobyteError

_US = 1e6


def now():
    """The timeline's clock, in seconds."""
    return time.perf_counter()


class Timeline:
    """Streams one worker's trace events to a file as they happen, so a
    crash loses at most the buffered tail (trace viewers accept a missing
    closing bracket)."""

    def __init__(self, path, rank):
        try:
            self.f = open(path, "w")
        except OSError as e:
            raise AutobyteError("autobyte: cannot write the timeline AUTOBYTE_TRACE=%s: %s" % (path, e)) from None
        self.pid = rank
        self.f.write('{"displayTimeUnit":"ms","otherData":{"clock":"CLOCK_MONOTONIC","rank":%d},"traceEvents":[\n' % rank)
        self._event({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "rank %d" % rank}})
        self._event({"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "training"}})

    def _event(self, e):
        self.f.write(json.dumps(e, separators=(",", ":")) + ",\n")

    def span(self, name, cat, t0, t1, **args):
        self._event({"name": name, "cat": cat, "ph": "X", "pid": self.pid, "tid": 0,
                     "ts": round(t0 * _US, 1), "dur": round(max(0.0, t1 - t0) * _US, 1), "args": args})

    def instant(self, name, cat, t, **args):
        self._event({"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.pid, "tid": 0,
                     "ts": round(t * _US, 1), "args": args})

    def close(self):
        if self.f is None:
            return
        # A last event without a trailing comma closes the array.
        self.f.write(json.dumps({"name": "end", "ph": "i", "s": "t", "pid": self.pid, "tid": 0,
                                 "ts": round(now() * _US, 1)}) + "\n]}\n")
        self.f.close()
        self.f = None


def load(path):
    """The events of one timeline file (a complete one, or one cut short by
    a crash)."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except ValueError:
        try:  # cut short: close the array ourselves
            doc = json.loads(text.rstrip().rstrip(",") + "]}")
        except ValueError as e:
            raise AutobyteError("autobyte.timeline: %s is not a timeline: %s" % (path, e)) from None
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise AutobyteError("autobyte.timeline: %s has no traceEvents" % path)
    return doc


class Worker:
    """One worker's steps, read from its timeline."""

    def __init__(self, path):
        doc = load(path)
        self.path = path
        self.rank = doc.get("otherData", {}).get("rank", 0)
        self.forward, self.backward = {}, {}  # step -> (t0, t1)
        self.waits = {}  # step (whose forward waited) -> layer -> (t0, t1)
        # step -> layer -> when its sums were known to be in place: the end
        # of the wait of its run of layers
        self.opened = {}
        self.posts = {}  # step -> layer -> last post time
        for e in doc["traceEvents"]:
            args = e.get("args", {})
            name, ts = e.get("name"), e.get("ts", 0) / _US
            if e.get("ph") == "X":
                span = (ts, ts + e.get("dur", 0) / _US)
                if name == "forward":
                    self.forward[args["step"]] = span
                elif name == "backward":
                    self.backward[args["step"]] = span
                elif e.get("cat") == "wait" and "layer" in args:
                    self.waits.setdefault(args["step"], {})[args["layer"]] = span
                    for layer in args.get("layers", [args["layer"]]):
                        self.opened.setdefault(args["step"], {})[layer] = span[1]
            elif name == "post":
                layers = self.posts.setdefault(args["step"], {})
                layers[args["layer"]] = max(layers.get(args["layer"], ts), ts)
        # The engine's pieces, if it wrote its timeline: step -> layer ->
        # [(phase, t0, t1)]. Engine iteration k+1 is training step k.
        self.pieces = {}
        engine = os.path.join(os.path.dirname(path), "engine-" + os.path.basename(path))
        if os.path.exists(engine):
            for e in load(engine)["traceEvents"]:
                if e.get("ph") != "X" or e.get("name") not in ("QUEUE", "COMMUNICATION"):
                    continue
                args = e.get("args", {})
                if "layer" not in args:
                    continue
                t0 = e["ts"] / _US
                self.pieces.setdefault(args["iteration"] - 1, {}).setdefault(args["layer"], []).append(
                    (e["name"], t0, t0 + e.get("dur", 0) / _US))

    def steps(self):
        return sorted(set(self.forward) & set(self.backward))


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize(paths, skip=5):
    """Medians per worker and across workers, leaving out the first skip
    steps (warm-up)."""
    workers = [Worker(p) for p in paths]
    out = {"workers": []}
    for w in workers:
        steps = [k for k in w.steps() if k >= skip]
        period = [w.backward[k + 1][0] - w.backward[k][0] for k in steps if k + 1 in w.backward]
        waits = {}
        for k in steps:
            for layer, (a, b) in w.waits.get(k, {}).items():
                waits.setdefault(layer, []).append(b - a)
        total = [sum(b - a for a, b in w.waits.get(k, {}).values()) for k in steps]
        out["workers"].append({
            "rank": w.rank, "steps": len(steps),
            "step_s": _median(period),
            "forward_s": _median([w.forward[k][1] - w.forward[k][0] for k in steps]),
            "backward_s": _median([w.backward[k][1] - w.backward[k][0] for k in steps]),
            "wait_s": _median(total),
            "wait_by_layer_s": {str(layer): _median(v) for layer, v in sorted(waits.items())},
        })
    # Layer 0's latency: its gradient of step k is posted by every worker at
    # the end of backward k; the sum gates forward k+1.
    lat, queued, flying = [], [], []
    if len(workers) > 1:
        for k in sorted(set.intersection(*[set(w.posts) for w in workers])):
            if k < skip:
                continue
            posted = [w.posts[k].get(0) for w in workers]
            if None in posted:
                continue
            last = max(posted)
            got = [w.waits[k + 1][0][1] for w in workers
                   if 0 in w.waits.get(k + 1, {}) and w.waits[k + 1][0][0] < last]
            if got:
                lat.append(min(got) - last)
            # The last worker to post: how long its layer 0 pieces queued,
            # and how long from the first start to the last sum in place.
            pieces = workers[posted.index(last)].pieces.get(k, {}).get(0, [])
            q = [b - a for ph, a, b in pieces if ph == "QUEUE"]
            c = [(a, b) for ph, a, b in pieces if ph == "COMMUNICATION"]
            if q and c:
                queued.append(max(q))
                flying.append(max(b for _, b in c) - min(a for a, _ in c))
    out["layer0_latency_s"] = _median(lat)
    out["layer0_latency_samples"] = len(lat)
    if queued:
        out["layer0_last_poster_queued_s"] = _median(queued)
        out["layer0_last_poster_in_flight_s"] = _median(flying)
    return out


def _paths(args):
    paths = []
    for a in args:
        if os.path.isdir(a):
            found = sorted(glob.glob(os.path.join(a, "rank-*.json")))
            if not found:
                raise AutobyteError("autobyte.timeline: %s holds no rank-*.json timelines" % a)
            paths += found
        elif os.path.exists(a):
            paths.append(a)
        else:
            raise AutobyteError("autobyte.timeline: %s does not exist" % a)
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m autobyte.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="timeline files, or directories of rank-*.json")
    p.add_argument("--skip", type=int, default=5, help="leave out the first SKIP steps (warm-up)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    try:
        s = summarize(_paths(a.paths), a.skip)
    except AutobyteError as e:
        print(e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(s))
        return 0
    ms = lambda x: "%.1f ms" % (1e3 * x)  # noqa: E731
    for w in s["workers"]:
        worst = sorted(w["wait_by_layer_s"].items(), key=lambda kv: -kv[1])[:3]
        print("rank %d: %d steps, step %s, forward %s (waiting %s), backward %s; longest waits: %s" % (
            w["rank"], w["steps"], ms(w["step_s"]), ms(w["forward_s"]), ms(w["wait_s"]), ms(w["backward_s"]),
            ", ".join("layer %s %s" % (k, ms(v)) for k, v in worst if v >= 5e-5) or "none"))
    if s["layer0_latency_samples"]:
        print("layer 0: its sum reached a waiting worker %s (median of %d steps) after the last worker posted it" % (
            ms(s["layer0_latency_s"]), s["layer0_latency_samples"]))
    if "layer0_last_poster_queued_s" in s:
        print("layer 0 on the last worker to post it (engine timelines): queued %s, then %s from start to sum in place" % (
            ms(s["layer0_last_poster_queued_s"]), ms(s["layer0_last_poster_in_flight_s"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
