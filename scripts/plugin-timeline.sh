#!/usr/bin/env bash
# Where a plugin step's time goes on a testbed (root): runs the example once
# per credit with --trace, and summarises each run's timelines with
# python -m autobyte.timeline (per worker: step, forward, backward and the
# waits per layer; across workers: layer 0's latency).
#
#   sudo scripts/plugin-timeline.sh [SCRIPT] [RATE] [WORKERS] [CREDITS] [AUTOBYTE LAUNCH FLAGS...]
#   sudo scripts/plugin-timeline.sh examples/torch_cnn.py 150Mbps 3 "512KB 2MB 16MB" --servers 3 --partition 256KB
#
# SCRIPT_ARGS (environment) are passed to the script (default: --iterations
# 40 --warmup 10); the timelines stay in $OUT/credit-C (default
# /tmp/plugin-timeline).
set -euo pipefail
cd "$(dirname "$0")/.."
script=${1:-examples/torch_cnn.py} rate=${2:-150Mbps} workers=${3:-3} credits=${4:-2MB}
shift $(( $# < 4 ? $# : 4 ))
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--servers "$workers" --partition 256KB)
args=${SCRIPT_ARGS:---iterations 40 --warmup 10}
out=${OUT:-/tmp/plugin-timeline}
go build -o /tmp/autobyte-timeline ./cmd/autobyte
ab=/tmp/autobyte-timeline
bed=abtl
servers=0
for ((i = 0; i < ${#flags[@]}; i++)); do [ "${flags[i]}" = --servers ] && servers=${flags[i + 1]}; done
$ab testbed up --name $bed --hosts $((workers + servers)) --rate "$rate" --congestion "${CONGESTION:-cubic}" >/dev/null
trap '$ab testbed down --name $bed >/dev/null 2>&1 || true' EXIT
for c in $credits; do
  rm -rf "$out/credit-$c"
  step=$($ab launch --testbed $bed --bandwidth "$rate" --workers "$workers" "${flags[@]}" --credit "$c" --trace "$out/credit-$c" \
    -- /usr/bin/python3 "$script" --backend autobyte $args 2>/dev/null |
    tail -1 | /usr/bin/python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["iteration_time_s"])')
  echo "== credit $c: step $step s (the script's steady-state mean)"
  PYTHONPATH=python /usr/bin/python3 -m autobyte.timeline --skip 10 "$out/credit-$c"
done
