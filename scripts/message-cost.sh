#!/usr/bin/env bash
# Measures the runtime's fixed cost per message: the same gradient bytes
# pushed and answered as few large pieces or many small ones, on unshaped
# loopback (autobyte launch, parameter servers, every process on this
# machine). The profile is one 16 MiB tensor (4 Mi fp32 parameters) with no
# compute, so an iteration is only communication; sharding is off and the
# credit (16 MB) admits every piece at once, so only the piece count changes
# between runs.
#
#   scripts/message-cost.sh [REPEATS] [ITERATIONS] [WORKERS] [SERVERS] [PARTITIONS]
#
# Defaults: 5 repeats, 20 iterations, 2 workers, 2 servers, partitions
# "4MB 64KB 16KB 4KB" (the first is the reference). With W = S every host
# sends and receives n messages per iteration when a worker has n pieces
# (a worker: n pushes out, n answers in; a server: n pushes in, n answers
# out), so the cost per message per host is
#
#   wall: (steady-state iteration time(small) - (reference)) / (n(small) - n(reference))
#   cpu:  (user+system CPU of the whole launch(small) - (reference))
#         / ((n(small) - n(reference)) * ITERATIONS * (W + S))
#
# The wall figure is what a job on this machine pays; all W + S processes
# share its cores, so it counts every host's work on the cores there are.
# The cpu figure is the CPU one host spends per message; start-up cancels
# in the difference. Each repeat runs every partition once, interleaved, and
# the summary gives the median, min and max over repeats. To leave the
# machine to others and to measure one core per process:
#
#   GOMAXPROCS=1 nice -n 19 scripts/message-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5} iters=${2:-20} workers=${3:-2} servers=${4:-2} parts=${5:-"4MB 64KB 16KB 4KB"}
dir=$(mktemp -d /tmp/message-cost.XXXXXX)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/autobyte" ./cmd/autobyte
ab=$dir/autobyte
cat >"$dir/flat16.json" <<'EOF'
{"name": "flat16", "batch_size": 1, "device": "none", "bytes_per_param": 4,
 "layers": [{"name": "l0", "forward_s": 0, "backward_s": 0, "tensors": [{"name": "t0", "params": 4194304}]}]}
EOF
common=(--workers "$workers" --servers "$servers" --profile "$dir/flat16.json" --credit 16MB --shard 0)
echo "rep partition pieces iteration_time_s cpu_s" >"$dir/runs.txt"
for rep in $(seq "$reps"); do
  for part in $parts; do
    n=$($ab sim "${common[@]}" --partition "$part" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pieces_per_iteration"])')
    t=$(/usr/bin/time -f '%U %S' -o "$dir/cpu" $ab launch "${common[@]}" --partition "$part" --iterations "$iters" \
          --verify none --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
    cpu=$(awk '{print $1 + $2}' "$dir/cpu")
    echo "$rep $part $n $t $cpu" | tee -a "$dir/runs.txt" >&2
  done
done
python3 - "$dir/runs.txt" "$iters" "$((workers + servers))" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
iters, hosts = int(sys.argv[2]), int(sys.argv[3])
runs = {}
for rep, part, n, t, cpu in rows:
    runs.setdefault(rep, []).append((part, int(n), float(t), float(cpu)))
ref = rows[0][1]
print(f"per message per host, reference partition {ref}; median [min, max] over {len(runs)} repeats")
print(f"{'partition':>9} {'pieces':>6} {'iteration s':>24} {'wall us/msg':>24} {'cpu us/msg/host':>24}")
for part in [r[1] for r in rows if r[0] == rows[0][0]][1:]:
    wall, cpu, its = [], [], []
    for rs in runs.values():
        (_, n0, t0, c0), = [r for r in rs if r[0] == ref]
        (_, n1, t1, c1), = [r for r in rs if r[0] == part]
        wall.append(1e6 * (t1 - t0) / (n1 - n0))
        cpu.append(1e6 * (c1 - c0) / ((n1 - n0) * iters * hosts))
        its.append(t1)
    f = lambda xs, d: f"{statistics.median(xs):.{d}f} [{min(xs):.{d}f}, {max(xs):.{d}f}]"
    print(f"{part:>9} {n1:>6} {f(its, 4):>24} {f(wall, 1):>24} {f(cpu, 1):>24}")
its0 = [t for rs in runs.values() for (p, _, t, _) in rs if p == ref]
print(f"reference {ref}: iteration {statistics.median(its0):.4f} s [{min(its0):.4f}, {max(its0):.4f}]")
EOF
