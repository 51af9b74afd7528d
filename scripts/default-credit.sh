#!/usr/bin/env bash
# The default credit on many parameter servers: ByteScheduler's 16 MB
# against autobyte's default (16 MB, or one partition per server where that
# is more), simulated, for each model and cluster size. Prints a markdown
# table: steady-state iteration time and its ratio to the lower bound.
#
#   scripts/default-credit.sh [MODELS] [CLUSTERS] [ITERATIONS]
#
# Defaults: "resnet50 vgg16 bert-base gpt2", "8:8 16:4 32:8 64:16 128:32"
# (workers:servers), 6 iterations, 10 Gbit/s links, 4 MB partitions.
set -euo pipefail
models=${1:-resnet50 vgg16 bert-base gpt2}
clusters=${2:-8:8 16:4 32:8 64:16 128:32}
iters=${3:-6}
cd "$(dirname "$0")/.."
bin=$(mktemp -d)/autobyte
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/autobyte

run() { # prints "credit_bytes iteration_time_s achieved_over_bound"
	"$bin" sim --iterations "$iters" --json "$@" |
		python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["credit_bytes"], d["iteration_time_s"], d["achieved_over_bound"])'
}

echo "| model | workers | servers | 16 MB credit: iteration (x bound) | default credit | iteration (x bound) | 16 MB / default |"
echo "|---|---:|---:|---|---:|---|---:|"
for m in $models; do
	for c in $clusters; do
		w=${c%%:*} s=${c##*:}
		read -r _ t0 b0 < <(run --model "$m" --workers "$w" --servers "$s" --credit 16MB)
		read -r cr t1 b1 < <(run --model "$m" --workers "$w" --servers "$s")
		python3 -c 'import sys; m,w,s,t0,b0,cr,t1,b1=sys.argv[1:]; print("| %s | %s | %s | %.3f s (%.2f) | %d MB | %.3f s (%.2f) | %.2fx |" % (m,w,s,float(t0),float(b0),int(float(cr))//1000000,float(t1),float(b1),float(t0)/float(t1)))' \
			"$m" "$w" "$s" "$t0" "$b0" "$cr" "$t1" "$b1"
	done
done
