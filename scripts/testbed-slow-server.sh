#!/usr/bin/env bash
# One parameter server's link slows down mid-run on the testbed (root): runs
# the job under --tuner autobyte and under each static configuration of a
# small candidate set, every host in its own namespace at tc rate, server 1's
# host cut to a quarter for the middle third of the run (--link-trace, set by
# the launcher as rank 0 reaches each step), and prints each run's mean
# iteration time over the whole run next to what 'autobyte sim' predicts for
# the same flags, median over REPEATS rounds interleaved so that they share
# the machine's noise.
#
#   sudo scripts/testbed-slow-server.sh [REPEATS]
#
# The job is tuneeval.TestbedLinkScenario (ResNet-50 replay, 3 workers, 3
# servers, 1 Gbit/s, server 1 at 250 Mbit/s from iteration 40 to 80 of 120).
# The static candidates are the simulator's best static configuration in
# hindsight over the tuner's grid and the candidate server weights
# ('autobyte tune gap --links'), the same partition and credit with even
# weights, and ByteScheduler's default (4MB/16MB) with the best weights and
# with even ones. Raw JSON goes to $OUT (default /tmp/testbed-slow-server).
# REUSE=DIR takes the static runs from an earlier $OUT instead of running
# them again (after a change to the tuner only; the table says so).
# See docs/tuner-eval.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-1}
out=${OUT:-/tmp/testbed-slow-server}
bed=abslow
scenario=resnet50-ps-3w-testbed-server1-4x
mkdir -p "$out"
go build -o /tmp/autobyte-slow ./cmd/autobyte
ab=/tmp/autobyte-slow
trap '$ab testbed down --name $bed >/dev/null 2>&1 || true' EXIT

job=(--model resnet50 --workers 3 --servers 3 --bandwidth 1Gbps --iterations 120 --link-trace server1=40:250Mbps,80:1Gbps)

# The simulator's best static configuration over the whole run.
$ab tune gap --links --only $scenario --json > "$out/gap.json" 2> "$out/gap.err"
read -r part credit weights < <(python3 - "$out/gap.json" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1]))[0]
c = g["best_static_config"]
w = c.get("ServerWeights") or []
print(c["PartitionBytes"], c["CreditBytes"], ":".join(map(str, w)) or "even")
EOF
)
echo "simulator: best static partition $part B, credit $credit B, weights $weights"
runs=(autobyte "$part:$credit:$weights" "$part:$credit:even" "4000000:16000000:$weights" "4000000:16000000:even")

$ab testbed down --name $bed >/dev/null 2>&1 || true
$ab testbed up --name $bed --hosts 6 --rate 1Gbps --congestion "${CONGESTION:-cubic}" >/dev/null

flags_of() { # RUN -> the tuner's flags
  local run=$1
  if [[ $run == autobyte ]]; then
    echo --tuner autobyte
    return
  fi
  IFS=: read -r p c w <<<"$run"
  local f="--tuner static --partition ${p}B --credit ${c}B"
  [[ $w == even ]] || f+=" --server-weights $w"
  echo "$f"
}
tag_of() { echo "${1//:/-}"; }

for run in "${runs[@]}"; do
  # shellcheck disable=SC2046
  $ab sim "${job[@]}" $(flags_of "$run") --latency 100us --json > "$out/$(tag_of "$run")-sim.json"
done
for r in $(seq 1 "$repeats"); do
  for run in "${runs[@]}"; do
    f="$out/$(tag_of "$run")-$r.json"
    if [[ -n ${REUSE:-} && $run != autobyte ]]; then
      cp "$REUSE/$(tag_of "$run")-$r.json" "$f"
      echo "run $run: reused from $REUSE"
      continue
    fi
    # shellcheck disable=SC2046
    $ab launch --testbed $bed "${job[@]}" $(flags_of "$run") --json > "$f" 2> "$out/$(tag_of "$run")-$r.err"
    scripts/testbed_summary.py run "$f" "$run"
  done
done

scripts/testbed_summary.py table "$out" "$repeats" --sim "${runs[@]}"
