#!/usr/bin/env bash
# The engine's CPU per MB and per message, at several commits: each REV is
# built in a temporary git worktree, and every build runs the same jobs on
# unshaped loopback (autobyte launch, every process on this machine, no
# compute: one 16 MiB float32 tensor, credit 16 MB, no sharding), on
# parameter servers (W workers, W servers) and on the ring (W workers).
# Rounds interleave the builds so that load on the machine hits them alike.
#
#   scripts/engine-cost.sh [OUT] [ROUNDS] [WORKERS] REV...
#   scripts/engine-cost.sh /tmp/ec 3 2 HEAD~1 HEAD
#
# Per round and build, with C(part, iters) the user+system CPU of the whole
# launch (every process):
#
#   CPU per MiB = (C(4MB, 120) - C(4MB, 20)) / (100 iterations * W * 16 MiB)
#                 (start-up cancels; the CPU of every process, servers
#                 included, per MiB of gradient a worker synchronises)
#   CPU per msg = (C(64KB, 120) - C(4MB, 120)) / ((n(64KB) - n(4MB)) * 120 * W)
#                 (per piece a worker synchronises, all processes' CPU;
#                 n = pieces per iteration)
#
# Prints medians [min, max] over rounds and writes OUT/runs.txt and
# OUT/summary.txt; docs/pytorch.md "Where communication is cheap" holds results.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-engine-cost} rounds=${2:-3} workers=${3:-2}
shift 3 || { echo "usage: $0 OUT ROUNDS WORKERS REV..." >&2; exit 2; }
[ $# -ge 1 ] || { echo "usage: $0 OUT ROUNDS WORKERS REV... (at least one REV)" >&2; exit 2; }
mkdir -p "$out"
tmp=$(mktemp -d /tmp/engine-cost.XXXXXX)
cleanup() {
  for d in "$tmp"/wt-*; do [ -d "$d" ] && git worktree remove --force "$d" >/dev/null 2>&1; done
  rm -rf "$tmp"
}
trap cleanup EXIT
revs=("$@")
for i in "${!revs[@]}"; do
  git worktree add --detach "$tmp/wt-$i" "${revs[$i]}" >/dev/null 2>&1 ||
    { echo "engine-cost: cannot check out ${revs[$i]}" >&2; exit 1; }
  (cd "$tmp/wt-$i" && go build -o "$tmp/ab-$i" ./cmd/autobyte)
done
cat >"$tmp/flat16.json" <<'EOF'
{"name": "flat16", "batch_size": 1, "device": "none", "bytes_per_param": 4,
 "layers": [{"name": "l0", "forward_s": 0, "backward_s": 0, "tensors": [{"name": "t0", "params": 4194304}]}]}
EOF
echo "round rev arch partition iterations pieces cpu_s" >"$out/runs.txt"
for r in $(seq "$rounds"); do
  for i in "${!revs[@]}"; do
    ab=$tmp/ab-$i
    for arch in ps ring; do
      if [ $arch = ps ]; then where=(--servers "$workers"); else where=(--arch allreduce); fi
      common=(--workers "$workers" "${where[@]}" --profile "$tmp/flat16.json" --credit 16MB --shard 0)
      for run in "4MB 20" "4MB 120" "64KB 120"; do
        set -- $run
        n=$($ab sim "${common[@]}" --partition "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pieces_per_iteration"])')
        /usr/bin/time -f '%U %S' -o "$tmp/cpu" $ab launch "${common[@]}" --partition "$1" --iterations "$2" \
          --verify none --json >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        cpu=$(awk '{print $1 + $2}' "$tmp/cpu")
        echo "$r ${revs[$i]} $arch $1 $2 $n $cpu" | tee -a "$out/runs.txt" >&2
      done
    done
  done
done
python3 - "$out/runs.txt" "$workers" <<'EOF' | tee "$out/summary.txt"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
w = int(sys.argv[2])
runs = {}
for r, rev, arch, part, iters, n, cpu in rows:
    runs[(r, rev, arch, part, int(iters))] = (int(n), float(cpu))
revs = list(dict.fromkeys(row[1] for row in rows))
rounds = sorted({row[0] for row in rows})
f = lambda xs, d: f"{statistics.median(xs):.{d}f} [{min(xs):.{d}f}, {max(xs):.{d}f}]"
print(f"{w} workers, loopback; medians [min, max] over {len(rounds)} rounds; CPU of every process of the job")
print(f"{'rev':>12} {'arch':>4} {'CPU ms per MiB':>24} {'CPU us per message':>24}")
for arch in ("ps", "ring"):
    for rev in revs:
        mib, msg = [], []
        for r in rounds:
            (_, a), (n0, b), (n1, c) = (runs[(r, rev, arch, "4MB", 20)], runs[(r, rev, arch, "4MB", 120)],
                                        runs[(r, rev, arch, "64KB", 120)])
            mib.append(1e3 * (b - a) / (100 * w * 16))
            msg.append(1e6 * (c - b) / ((n1 - n0) * 120 * w))
        print(f"{rev:>12} {arch:>4} {f(mib, 2):>24} {f(msg, 1):>24}")
EOF
