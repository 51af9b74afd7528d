#!/usr/bin/env bash
# Does the plugin job's best credit move with the link rate? (root) Runs
# the example on a testbed once per rate and credit, every host shaped to
# the rate, parameter servers on hosts of their own, and prints the
# script's steady-state step time of each run. See docs/runtime-tuning.md.
#
#   sudo scripts/plugin-credit-sweep.sh [SCRIPT] [WORKERS] [RATES] [CREDITS] [PARTITION]
#   sudo scripts/plugin-credit-sweep.sh examples/torch_cnn.py 3 "100Mbps 400Mbps" "512KB 1MB 2MB 4MB 16MB" 256KB
#
# SCRIPT_ARGS (environment) are passed to the script (default: --iterations
# 30 --warmup 10).
set -euo pipefail
cd "$(dirname "$0")/.."
script=${1:-examples/torch_cnn.py} workers=${2:-3} rates=${3:-"100Mbps 400Mbps"}
credits=${4:-"512KB 1MB 2MB 4MB 16MB"} part=${5:-256KB}
args=${SCRIPT_ARGS:---iterations 30 --warmup 10}
go build -o /tmp/autobyte-credit-sweep ./cmd/autobyte
ab=/tmp/autobyte-credit-sweep bed=abcs
trap '$ab testbed down --name $bed >/dev/null 2>&1 || true' EXIT
for rate in $rates; do
  $ab testbed down --name $bed >/dev/null 2>&1 || true
  $ab testbed up --name $bed --hosts $((2 * workers)) --rate "$rate" --congestion "${CONGESTION:-cubic}" >/dev/null
  for c in $credits; do
    # shellcheck disable=SC2086 # $args is a list of arguments
    step=$($ab launch --testbed $bed --bandwidth "$rate" --workers "$workers" --servers "$workers" --partition "$part" --credit "$c" \
      -- /usr/bin/python3 "$script" --backend autobyte $args 2>/dev/null |
      tail -1 | /usr/bin/python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["iteration_time_s"])')
    echo "rate $rate partition $part credit $c: step $step s"
  done
done
