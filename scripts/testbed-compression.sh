#!/usr/bin/env bash
# What compression buys on the testbed: a replay job (each process in its
# own network namespace, tc shaping every host to RATE both ways) run
# ROUNDS times per compression (none, bf16, fp16, alternating), with its
# median steady-state iteration time beside `autobyte sim` given the same
# flags, and the speedup over none. Sums are verified in every run.
#
#   sudo scripts/testbed-compression.sh [MODEL] [RATE] [WORKERS] [SERVERS] [ITERATIONS] [COMPUTE_SCALE] [ROUNDS]
#
# SERVERS 0 runs ring all-reduce.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
model=${1:-resnet50} rate=${2:-1Gbps} workers=${3:-4} servers=${4:-2} iters=${5:-10} scale=${6:-8} rounds=${7:-3}
ab=${AUTOBYTE_BIN:-/tmp/autobyte-compression}
if [ -z "${AUTOBYTE_BIN:-}" ]; then go build -o "$ab" ./cmd/autobyte; fi
topo=(--servers "$servers")
[ "$servers" = 0 ] && topo=(--arch allreduce)
declare -A runs
launch_rounds runs "$rounds" --compression "none bf16 fp16" \
  "$ab" launch --testbed abcomp --congestion "${CONGESTION:-cubic}" --model "$model" --workers "$workers" "${topo[@]}" \
  --bandwidth "$rate" --iterations "$iters" --compute-scale "$scale"
base=$(median ${runs[none]})
printf "%-12s %10s %10s %8s %8s  %s\n" compression measured_s simulated_s diff speedup rounds
for c in none bf16 fp16; do
  med=$(median ${runs[$c]})
  p=$("$ab" sim --model "$model" --workers "$workers" "${topo[@]}" --bandwidth "$rate" \
      --iterations "$iters" --compute-scale "$scale" --compression "$c" --json | json_time)
  printf "%-12s %10.3f %10.3f %+7.1f%% %7.2fx  %s\n" "$c" "$med" "$p" "$(awk -v a="$med" -v b="$p" 'BEGIN{print 100*(a/b-1)}')" \
    "$(awk -v a="$base" -v b="$med" 'BEGIN{print a/b}')" "${runs[$c]}"
done
