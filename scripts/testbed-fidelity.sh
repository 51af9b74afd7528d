#!/usr/bin/env bash
# Testbed fidelity at nominal tc rates: runs a replay job on the testbed
# (each process in its own network namespace, tc shaping every host to RATE
# both ways) ROUNDS times per scheduler, fifo and bytescheduler alternating,
# and compares each median steady-state iteration time with `autobyte sim`
# given the same flags (the nominal rate, no correction).
#
#   sudo scripts/testbed-fidelity.sh [MODEL] [RATE] [WORKERS] [SERVERS] [ITERATIONS] [COMPUTE_SCALE] [ROUNDS] [SIM_FLAGS...]
#
# SIM_FLAGS are passed to the simulator only (e.g. --message-cost 20us), to
# test a model of the machine against the same measurements. CONGESTION
# (environment; default cubic, the testbed's default) is the hosts' TCP
# congestion control.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
model=${1:-alexnet} rate=${2:-1Gbps} workers=${3:-4} servers=${4:-2} iters=${5:-10} scale=${6:-4} rounds=${7:-3}
shift $(( $# < 7 ? $# : 7 ))
simflags=("$@")
ab=${AUTOBYTE_BIN:-/tmp/autobyte-fidelity}
if [ -z "${AUTOBYTE_BIN:-}" ]; then go build -o "$ab" ./cmd/autobyte; fi
cc=${CONGESTION:-cubic}
"$ab" testbed down --name abfid
"$ab" testbed up --name abfid --hosts $((workers + servers)) --rate "$rate" --congestion "$cc" >/dev/null
trap '"$ab" testbed down --name abfid' EXIT
echo "hosts' TCP congestion control: $cc" >&2
declare -A runs
launch_rounds runs "$rounds" --scheduler "fifo bytescheduler" \
  "$ab" launch --testbed abfid --model "$model" --workers "$workers" --servers "$servers" \
  --bandwidth "$rate" --iterations "$iters" --compute-scale "$scale"
printf "%-14s %10s %10s %8s  %s\n" scheduler measured_s simulated_s diff rounds
for s in fifo bytescheduler; do
  med=$(median ${runs[$s]})
  p=$("$ab" sim --model "$model" --workers "$workers" --servers "$servers" --bandwidth "$rate" \
      --iterations "$iters" --compute-scale "$scale" --scheduler "$s" "${simflags[@]}" --json | json_time)
  printf "%-14s %10.3f %10.3f %+7.1f%%  %s\n" "$s" "$med" "$p" "$(awk -v a="$med" -v b="$p" 'BEGIN{print 100*(a/b-1)}')" "${runs[$s]}"
done
