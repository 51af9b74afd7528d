#!/usr/bin/env bash
# A rate drop mid-run on the testbed (root): runs one job with --tuner autobyte
# and once per static configuration of a small candidate set, with the same
# bandwidth trace driving every host's tc rate, and prints the mean iteration
# time over the whole run (tuning included) of each, median over REPEATS runs
# interleaved so that they share the machine's noise.
#
#   sudo scripts/testbed-retune.sh [MODEL] [WORKERS] [SERVERS] [TRACE] [ITERATIONS] [REPEATS]
#
# The candidate set is ByteScheduler's default (4MB/16MB), the best static
# configuration the simulator finds over the whole run among the grid
# 256KB..16MB × 1MB..64MB, and any PARTITION:CREDIT pairs in $EXTRA
# (default "16MB:64MB 1MB:4MB"). Raw JSON goes to $OUT (default
# /tmp/testbed-retune). See docs/runtime-tuning.md.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet50} workers=${2:-2} servers=${3:-2}
trace=${4:-0:2Gbps,25:500Mbps,55:2Gbps} iters=${5:-80} repeats=${6:-1}
extra=${EXTRA:-16MB:64MB 1MB:4MB}
out=${OUT:-/tmp/testbed-retune}
bed=abretune
mkdir -p "$out"
go build -o /tmp/autobyte-retune ./cmd/autobyte
ab=/tmp/autobyte-retune
trap '$ab testbed down --name $bed >/dev/null 2>&1 || true' EXIT

job=(--model "$model" --workers "$workers" --servers "$servers" --iterations "$iters" --bandwidth-trace "$trace")

# The simulator's best static configuration over the whole run.
read -r best bestt simab < <(scripts/sim-best-static.sh "$ab" "${job[@]}")
echo "simulator: best static $best ($bestt s), autobyte $simab s"

cands=("4MB:16MB" "$best")
for e in $extra; do [[ " ${cands[*]} " == *" $e "* ]] || cands+=("$e"); done
runs=(autobyte "${cands[@]}")

# The testbed: one host per process, every host at the trace's first rate.
$ab testbed down --name $bed >/dev/null 2>&1 || true
first=${trace%%,*}
$ab testbed up --name $bed --hosts $((workers + servers)) --rate "${first#*:}" --congestion "${CONGESTION:-cubic}" >/dev/null

for r in $(seq 1 "$repeats"); do
  for run in "${runs[@]}"; do
    if [[ $run == autobyte ]]; then
      flags=(--tuner autobyte) tag=autobyte
    else
      flags=(--tuner static --partition "${run%:*}" --credit "${run#*:}") tag=${run/:/-}
    fi
    f="$out/$tag-$r.json"
    $ab launch --testbed $bed "${job[@]}" "${flags[@]}" --json > "$f" 2> "$out/$tag-$r.err"
    scripts/testbed_summary.py run "$f" "$run"
  done
done

scripts/testbed_summary.py table "$out" "$repeats" "${runs[@]}"
