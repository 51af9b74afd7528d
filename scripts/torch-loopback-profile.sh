#!/usr/bin/env bash
# Where the 2 cores go in a loopback plugin job (root, or perf allowed for
# the user): runs torchvision's MODEL through VARIANT with 3 workers, lets it
# warm up for DELAY seconds, samples every CPU for SECONDS with perf (the
# job's ITERATIONS steps, default 60, must outlast both), and
# prints the share of the samples that went to torch's own work, to the
# communication (autobyte's engine inside the workers and its servers, or
# gloo's threads), to the kernel and to idle, with the hottest symbols of the
# communication. The step time comes from the job itself, after perf is done.
# docs/pytorch.md "Where communication is cheap" quotes it.
#
#   scripts/torch-loopback-profile.sh [MODEL] [VARIANT] [DELAY] [SECONDS]
#
# MODEL: resnet18 or resnet50 (default). VARIANT: ps (3 servers, default),
# ring or ddp, with scripts/torch-loopback-models.sh's flags.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet50} variant=${2:-ps} delay=${3:-25} seconds=${4:-8}
command -v perf >/dev/null || { echo "torch-loopback-profile.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 4MB --credit 16MB"
case $variant in
  ps) launch="--servers 3 $cfg" backend=autobyte ;;
  ring) launch="--arch allreduce $cfg" backend=autobyte ;;
  ddp) launch="--arch allreduce" backend=ddp ;;
  *) echo "torch-loopback-profile.sh: no variant '$variant' (have: ps ring ddp)" >&2; exit 2 ;;
esac
ab=/tmp/autobyte-loopback-profile
go build -o $ab ./cmd/autobyte
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
iterations=${ITERATIONS:-60}
# shellcheck disable=SC2086 # launch is a list of flags
PYTHONPATH=python $ab launch --workers 3 $launch -- "$py" examples/torch_resnet.py --backend $backend \
  --model "$model" --iterations "$iterations" --warmup 5 >"$work/job.out" 2>&1 &
job=$!
sleep "$delay"
kill -0 $job 2>/dev/null || { cat "$work/job.out" >&2; echo "torch-loopback-profile.sh: the job ended before sampling began" >&2; exit 1; }
perf record -a -q -o "$work/perf.data" -- sleep "$seconds" >/dev/null 2>&1
kill -0 $job 2>/dev/null || { echo "torch-loopback-profile.sh: the job ended while perf sampled; raise ITERATIONS (now $iterations)" >&2; exit 1; }
wait $job || { cat "$work/job.out" >&2; echo "torch-loopback-profile.sh: the job failed" >&2; exit 1; }
perf report -i "$work/perf.data" --sort comm,dso --stdio --no-children 2>/dev/null >"$work/by-dso.txt"
perf report -i "$work/perf.data" --sort comm,dso,sym --stdio --no-children 2>/dev/null >"$work/by-sym.txt"
python3 - "$work" "$model" "$variant" "$(basename $ab)" <<'EOF'
import re, sys
work, model, variant, server_binary = sys.argv[1:]
def read(name):
    """perf report's rows: (share %, comm, dso, symbol or "")."""
    out = []
    for line in open(f"{work}/{name}"):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\S+)(?:\s+\[.\]\s+(.*))?", line)
        if m and not line.lstrip().startswith("#"):
            out.append((float(m[1]), m[2], m[3], (m[4] or "").strip()))
    return out
def kind(comm, dso):
    if comm == "swapper":
        return "idle"
    if comm.startswith(("gloo", "pt_gloo")):
        return "communication: gloo threads"
    if dso == "[kernel.kallsyms]":
        return "kernel, in the workers' and servers' threads (autobyte's engine's among them)"
    if dso == "libautobyte.so":
        return "communication: autobyte engine in the workers"
    # perf names a process by the first 15 characters of its binary's name.
    if comm == server_binary[:15] or dso == server_binary:
        return "communication: autobyte servers"
    if comm == "python":
        return "training (torch, Python)"
    return "other"
shares = {}
for s, comm, dso, _ in read("by-dso.txt"):
    k = kind(comm, dso)
    shares[k] = shares.get(k, 0) + s
print(f"{model}, {variant}, 3 workers on loopback: share of all CPU samples")
for k, s in sorted(shares.items(), key=lambda x: -x[1]):
    print(f"  {s:6.2f}%  {k}")
print("hottest communication symbols:")
hot = [(s, comm, sym) for s, comm, dso, sym in read("by-sym.txt") if kind(comm, dso).startswith("communication")]
for s, comm, sym in sorted(hot, reverse=True)[:6]:
    print(f"  {s:6.2f}%  {comm:16s} {sym[:90]}")
EOF
grep '^{' "$work/job.out" | tail -1 | python3 -c 'import json,sys
r = json.load(sys.stdin); print("step %.3f s (mean of %d steps less the first 5)" % (r["iteration_time_s"], r["iterations"]))'
