#!/usr/bin/env bash
# Compares the two ways a parameter server hands back a sum: as the answer
# to the push (default) or to a separate pull request (--ps-pull), on a local
# cluster with in-process shaping. Prints the steady-state iteration time of
# each run; run it on a quiet machine.
#
#   scripts/ps-answer-vs-pull.sh [MODEL] [RATE] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet50} rate=${2:-2Gbps} reps=${3:-3}
go build -o /tmp/autobyte-pull ./cmd/autobyte
printf "%-8s %-22s %s\n" mode pieces iteration_time_s
for rep in $(seq "$reps"); do
  for mode in answer pull; do
    flag=""; [ "$mode" = pull ] && flag=--ps-pull
    for cfg in "4MB 16MB" "256KB 2MB"; do
      set -- $cfg
      t=$(/tmp/autobyte-pull launch --workers 4 --servers 2 --model "$model" --bandwidth "$rate" --iterations 8 \
            --partition "$1" --credit "$2" $flag --json 2>/dev/null |
          python3 -c 'import json,sys; print(round(json.load(sys.stdin)["iteration_time_s"], 4))')
      printf "%-8s %-22s %s\n" "$mode" "partition $1 credit $2" "$t"
    done
  done
done
