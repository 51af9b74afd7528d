#!/usr/bin/env bash
# Small, testbed-sized scenarios with a rate step mid-run (80 iterations): the
# simulator's best static configuration among 256KB..16MB x 1MB..64MB, its mean
# iteration time over the run, and the autobyte tuner's, with the difference.
# It shows whether a scenario the 2-core testbed can run leaves the tuner
# anything to gain (docs/runtime-tuning.md).
#
#   scripts/testbed-scenarios-sim.sh            # MODELS="resnet50 vgg16 alexnet" by default
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o /tmp/autobyte-scen ./cmd/autobyte
ab=/tmp/autobyte-scen
for model in ${MODELS:-resnet50 vgg16 alexnet}; do
 for ws in "2 2" "3 3" "2 1"; do
  set -- $ws
  for trace in 0:2Gbps,25:500Mbps,55:2Gbps 0:2Gbps,25:200Mbps,55:2Gbps 0:1Gbps,25:100Mbps,55:1Gbps 0:500Mbps,25:2Gbps,55:500Mbps; do
    job=(--model $model --workers $1 --servers $2 --iterations 80 --bandwidth-trace $trace)
    read -r best bestt a < <(scripts/sim-best-static.sh "$ab" "${job[@]}")
    echo "$model $1w/$2s $trace best $best $bestt autobyte $a $(awk -v a=$a -v b=$bestt 'BEGIN{printf "%+.1f%%", 100*(a/b-1)}')"
  done
 done
done
