#!/usr/bin/env python3
"""Times a PyTorch example under several variants (autobyte with some launch
flags, DDP with some script flags, ...) on the same testbed (root): each
host is a network namespace with its rate shaped by tc, one worker per host;
all-reduce and DDP run on the first WORKERS hosts, parameter servers (if a
variant asks for them) on hosts of their own. Rounds alternate the variants
so that load on the machine hits them alike. Prints each run, the median
per variant and its speedup over the first variant (the baseline), and
writes every number to --out as JSON.

  sudo scripts/torch_compare.py --rate 100Mbps --workers 4 --rounds 3 \\
      --variant 'ddp=--arch allreduce | --backend ddp' \\
      --variant 'ring-bf16=--arch allreduce --compression bf16 | --backend autobyte' \\
      -- examples/torch_cnn.py --iterations 20 --warmup 5

A variant is NAME=LAUNCH FLAGS | SCRIPT FLAGS [| VAR=VALUE ...]: the flags
before the first '|' go to `autobyte launch`, those after it to the script,
after the common script arguments that follow '--'; the assignments after a
second '|' are set in the environment of the launch and its processes. --loopback runs every process on unshaped
loopback instead (no testbed, no root).
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variant(spec):
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("--variant %r: want NAME=LAUNCH FLAGS | SCRIPT FLAGS" % spec)
    launch, _, rest = rest.partition("|")
    script, _, env = rest.partition("|")
    assigns = {}
    for a in shlex.split(env):
        k, eq, v = a.partition("=")
        if not eq or not k:
            raise argparse.ArgumentTypeError("--variant %r: %r is not VAR=VALUE" % (spec, a))
        assigns[k] = v
    return name.strip(), shlex.split(launch), shlex.split(script), assigns


def run(ab, bed, args, launch, script_flags, env):
    where = [] if args.loopback else ["--testbed", bed, "--bandwidth", args.rate, "--congestion", os.environ.get("CONGESTION", "cubic")]
    cmd = [ab, "launch"] + where + ["--workers", str(args.workers)] + launch + ["--", args.python] + args.script + script_flags
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=args.timeout,
                       env=dict(os.environ, **env))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = "\n".join(p.stderr.splitlines()[-15:])
        sys.exit("torch_compare: %s failed (exit %d) after %.0f s:\n%s" % (" ".join(cmd), p.returncode, time.monotonic() - t0, tail))
    return json.loads(lines[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100Mbps", help="each host's link rate (tc), also the launch's --bandwidth")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter of the script (a venv's for another torch)")
    p.add_argument("--variant", action="append", type=parse_variant, required=True, help="NAME=LAUNCH FLAGS | SCRIPT FLAGS")
    p.add_argument("--out", default="", help="write the runs and medians to this JSON file")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    p.add_argument("--name", default="abcmp", help="testbed name")
    p.add_argument("--loopback", action="store_true", help="unshaped loopback, no testbed (--rate unused)")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = p.parse_args()
    if args.script and args.script[0] == "--":
        args.script = args.script[1:]
    if not args.script:
        p.error("want -- SCRIPT [ARGS...] after the flags")
    if args.workers < 1 or args.rounds < 1:
        p.error("--workers and --rounds must be >= 1, got %d and %d" % (args.workers, args.rounds))
    names = [v[0] for v in args.variant]
    if len(set(names)) < len(names):
        p.error("variant names must differ, got %s" % names)

    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                                   stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    ab = "/tmp/autobyte-torch-compare"
    subprocess.run(["go", "build", "-o", ab, "./cmd/autobyte"], cwd=ROOT, check=True)
    if not args.loopback:
        subprocess.run([ab, "testbed", "up", "--name", args.name, "--hosts", str(2 * args.workers), "--rate", args.rate],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    print("%s, %d workers %s, %s (torch %s), %d rounds" % (" ".join(args.script), args.workers,
                                                           "on loopback" if args.loopback else "at " + args.rate,
                                                           args.python, torch_version, args.rounds), flush=True)
    runs = {n: [] for n in names}
    try:
        for r in range(args.rounds):
            for name, launch, flags, env in args.variant:
                res = run(ab, args.name, args, launch, flags, env)
                runs[name].append(res)
                print("round %d  %-16s %.3f s/step  cpu %.3f s/step (training thread %.3f)  final loss %.6f" % (
                    r + 1, name, res["iteration_time_s"], res.get("cpu_per_step_s", float("nan")),
                    res.get("training_thread_cpu_per_step_s", float("nan")), res["final_loss"]), flush=True)
    finally:
        if not args.loopback:
            subprocess.run([ab, "testbed", "down", "--name", args.name], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    base = names[0]
    def median_of(n, key):
        return statistics.median(x[key] for x in runs[n]) if all(key in x for x in runs[n]) else None
    medians = {n: median_of(n, "iteration_time_s") for n in names}
    # Rank 0's CPU per steady step, all its threads and the training
    # thread's alone, where the script reports them.
    cpu = {n: median_of(n, "cpu_per_step_s") for n in names}
    train_cpu = {n: median_of(n, "training_thread_cpu_per_step_s") for n in names}
    summary = []
    for name, launch, flags, env in args.variant:
        times = [x["iteration_time_s"] for x in runs[name]]
        # Per-round ratios pair each run with the baseline's run of the same round.
        ratios = [b["iteration_time_s"] / x["iteration_time_s"] for b, x in zip(runs[base], runs[name])]
        summary.append({"variant": name, "launch": launch, "script_flags": flags, "env": env, "iteration_time_s": times,
                        "median_s": medians[name], "speedup_over_" + base: medians[base] / medians[name],
                        "round_ratios": ratios, "median_cpu_per_step_s": cpu[name],
                        "median_training_thread_cpu_per_step_s": train_cpu[name]})
        print("median %-16s %.3f s/step  %.2fx %s  (rounds %s)%s%s" % (
            name, medians[name], medians[base] / medians[name], base, " ".join("%.2f" % q for q in ratios),
            "" if cpu[name] is None else "  rank 0 cpu %.3f s/step" % cpu[name],
            "" if train_cpu[name] is None else " (training thread %.3f)" % train_cpu[name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"script": args.script, "rate": "loopback" if args.loopback else args.rate, "workers": args.workers, "rounds": args.rounds,
                       "python": args.python, "torch": torch_version, "cpus": os.cpu_count(), "host": platform.node(),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S"), "variants": summary,
                       "results": {n: runs[n] for n in names}}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
