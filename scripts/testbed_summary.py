#!/usr/bin/env python3
"""Summaries of testbed runs of `autobyte launch --json`, for the testbed
scripts that run one job under several tuners in interleaved rounds.

  testbed_summary.py run FILE RUN
      one line for one run: its mean iteration time, whether its sums were
      verified, and the configurations it went through
  testbed_summary.py table OUT REPEATS [--sim] RUN...
      a Markdown table of every RUN's median over REPEATS rounds (files
      OUT/TAG-R.json, R = 1..REPEATS) against the best static run measured;
      with --sim, beside what `autobyte sim --json` predicted
      (OUT/TAG-sim.json)

A RUN is "autobyte" or a static configuration "PARTITION:CREDIT[:WEIGHTS]"
(bytes or sizes such as 4MB; WEIGHTS "1000:250:1000" or "even"); its TAG is
RUN with ':' replaced by '-'.
"""
import json
import statistics
import sys


def tag(run):
    return run.replace(":", "-")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("testbed_summary: cannot read run %s: %s" % (path, e))


def size(v):
    return "%.4g MB" % (int(v) / 1e6) if v.isdigit() else v


def name(run):
    if run == "autobyte":
        return run
    parts = run.split(":", 2)
    if len(parts) < 2:
        sys.exit("testbed_summary: run %r: want autobyte or PARTITION:CREDIT[:WEIGHTS]" % run)
    out = "static %s / %s" % (size(parts[0]), size(parts[1]))
    if len(parts) == 3:
        out += ", weights " + parts[2]
    return out


def configs(d):
    """The configurations a run went through: "FROM:PARTITION/CREDIT[ wWEIGHTS]"."""
    out = []
    for c in d.get("configs") or []:
        s = "%d:%g/%g MB" % (c["from_iteration"], c["partition_bytes"] / 1e6, c["credit_bytes"] / 1e6)
        if c.get("server_weights"):
            s += " w" + ":".join(map(str, c["server_weights"]))
        out.append(s)
    return "; ".join(out)


def run_line(path, run):
    d = load(path)
    return "run %-32s mean %.3f s  verified %s  configs %s" % (run, d["mean_iteration_time_s"], d["verified"], configs(d))


def table(out, repeats, runs, sim=False):
    res = {}
    for r in runs:
        ds = [load("%s/%s-%d.json" % (out, tag(r), i)) for i in range(1, repeats + 1)]
        means = [d["mean_iteration_time_s"] for d in ds]
        simulated = load("%s/%s-sim.json" % (out, tag(r)))["mean_iteration_time_s"] if sim else None
        res[r] = (statistics.median(means), all(d["verified"] for d in ds), means, simulated)
    statics = [r for r in runs if r != "autobyte"]
    if not statics:
        sys.exit("testbed_summary: no static run among %s to compare with" % runs)
    best = min(statics, key=lambda r: res[r][0])
    head = "| run | mean iteration (median of %d) | vs best static measured |" % repeats
    rule = "|---|---:|---:|"
    if sim:
        head += " simulated | measured vs simulated |"
        rule += "---:|---:|"
    lines = ["", head + " verified | runs |", rule + "---|---|"]
    for r in runs:
        m, verified, means, simulated = res[r]
        row = "| %s | %.3f s | %+.1f%% |" % (name(r), m, 100 * (m / res[best][0] - 1))
        if sim:
            row += " %.3f s | %+.1f%% |" % (simulated, 100 * (m / simulated - 1))
        lines.append(row + " %s | %s |" % (verified, ", ".join("%.3f" % x for x in means)))
    lines += ["", "best static measured: %s" % best]
    return "\n".join(lines)


def main(argv):
    if len(argv) == 3 and argv[0] == "run":
        print(run_line(argv[1], argv[2]))
        return
    if len(argv) >= 4 and argv[0] == "table":
        sim = "--sim" in argv
        args = [a for a in argv[1:] if a != "--sim"]
        try:
            repeats = int(args[1])
        except ValueError:
            sys.exit("testbed_summary: REPEATS must be a whole number, got %r" % args[1])
        if repeats < 1:
            sys.exit("testbed_summary: REPEATS must be >= 1, got %d" % repeats)
        print(table(args[0], repeats, args[2:], sim))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
