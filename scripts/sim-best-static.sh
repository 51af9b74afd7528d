#!/usr/bin/env bash
# The simulator's best static configuration over a whole run, among
# partitions 256KB..16MB × credits 1MB..64MB, and the autobyte tuner's mean
# on the same run. Prints one line: BEST_PARTITION:CREDIT BEST_MEAN_S AUTOBYTE_MEAN_S.
#
#   scripts/sim-best-static.sh AUTOBYTE_BINARY SIM_FLAGS...
#   scripts/sim-best-static.sh ./autobyte --model resnet50 --workers 2 --servers 2 --iterations 80 --bandwidth-trace 0:2Gbps,25:500Mbps
#
# Used by testbed-retune.sh and testbed-scenarios-sim.sh.
set -euo pipefail
ab=${1:?autobyte binary}
shift
mean() { python3 -c 'import json,sys; print(json.load(sys.stdin)["mean_iteration_time_s"])'; }
best="" bestt=""
for p in 256KB 1MB 4MB 16MB; do
  for c in 1MB 4MB 16MB 64MB; do
    t=$("$ab" sim "$@" --partition "$p" --credit "$c" --json | mean)
    if [[ -z $bestt ]] || awk -v a="$t" -v b="$bestt" 'BEGIN{exit !(a<b)}'; then best="$p:$c" bestt=$t; fi
  done
done
echo "$best $bestt $("$ab" sim "$@" --tuner autobyte --json | mean)"
