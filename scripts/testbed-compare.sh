#!/usr/bin/env bash
# Measures bytescheduler against fifo on the testbed (root) and compares each
# steady-state iteration time with the simulator's prediction for the same job.
#
#   sudo scripts/testbed-compare.sh [MODEL] [RATE] [WORKERS] [SERVERS] [ITERATIONS] [COMPUTE_SCALE]
#
# tc shapes Ethernet frames; TCP over them delivers 1448 payload bytes per
# 1514-byte frame (95.6%), so the simulator is given that goodput rate.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-alexnet} rate=${2:-1Gbps} workers=${3:-4} servers=${4:-2} iters=${5:-6} scale=${6:-1}
go build -o /tmp/autobyte-compare ./cmd/autobyte
ab=/tmp/autobyte-compare
num=${rate%%[A-Za-z]*} unit=${rate#"$num"}
goodput=$(awk -v n="$num" 'BEGIN { printf "%.6g", n * 1448 / 1514 }')$unit
printf "%-14s %10s %10s %8s  %s\n" scheduler measured_s simulated_s diff verified
declare -A measured
for s in fifo bytescheduler; do
  read -r m v < <($ab launch --testbed abcmp --congestion "${CONGESTION:-cubic}" --model "$model" --workers "$workers" --servers "$servers" \
      --bandwidth "$rate" --iterations "$iters" --compute-scale "$scale" --scheduler "$s" --json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["iteration_time_s"], d["verified"])')
  p=$($ab sim --model "$model" --workers "$workers" --servers "$servers" --bandwidth "$goodput" --latency 100us \
      --iterations "$iters" --compute-scale "$scale" --scheduler "$s" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
  measured[$s]=$m

  printf "%-14s %10.3f %10.3f %+7.1f%%  %s\n" "$s" "$m" "$p" "$(awk -v a="$m" -v b="$p" 'BEGIN{print 100*(a/b-1)}')" "$v"
  eval "pred_$s=$p"
done
awk -v f="${measured[fifo]}" -v b="${measured[bytescheduler]}" -v pf="$pred_fifo" -v pb="$pred_bytescheduler" \
  'BEGIN { printf "speedup bytescheduler/fifo: measured %.2fx, simulated %.2fx\n", f/b, pf/pb }'
