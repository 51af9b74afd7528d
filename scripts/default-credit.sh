#!/usr/bin/env bash
# The default credit on parameter servers: ByteScheduler's 16 MB against
# autobyte's default (16 MB, or one partition per server up to one per
# worker where that is more; proto.DefaultCredit), simulated with 4 MB
# partitions.
#
#   scripts/default-credit.sh table [MODELS] [CLUSTERS] [ITERATIONS]
#   scripts/default-credit.sh grid
#   sudo scripts/default-credit.sh testbed [ROUNDS]
#
# table: a markdown table of the steady-state iteration time and its ratio
# to the lower bound at 10 Gbit/s; defaults "resnet50 vgg16 bert-base gpt2",
# "8:8 16:4 32:8 64:16 128:32" (workers:servers), 6 iterations.
# grid: every zoo model but toy3 x compute scale {1, 4, 8} x {1, 10} Gbit/s
# x workers:servers {4:8, 8:8, 16:16, 32:8, 6:12, 12:6}, 6 iterations;
# prints each job's 16 MB time over the default's, then the minimum, median
# and maximum and the jobs the default makes slower.
set -euo pipefail
mode=${1:-table}
cd "$(dirname "$0")/.."
. scripts/lib.sh
bin=$(mktemp -d)/autobyte
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/autobyte

run() { # ITERATIONS FLAGS...: prints "credit_bytes iteration_time_s achieved_over_bound"
	local iters=$1
	shift
	"$bin" sim --iterations "$iters" --json "$@" |
		python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["credit_bytes"], d["iteration_time_s"], d["achieved_over_bound"])'
}

case $mode in
table)
	models=${2:-resnet50 vgg16 bert-base gpt2}
	clusters=${3:-8:8 16:4 32:8 64:16 128:32}
	iters=${4:-6}
	echo "| model | workers | servers | 16 MB credit: iteration (x bound) | default credit | iteration (x bound) | 16 MB / default |"
	echo "|---|---:|---:|---|---:|---|---:|"
	for m in $models; do
		for c in $clusters; do
			w=${c%%:*} s=${c##*:}
			read -r _ t0 b0 < <(run "$iters" --model "$m" --workers "$w" --servers "$s" --credit 16MB)
			read -r cr t1 b1 < <(run "$iters" --model "$m" --workers "$w" --servers "$s")
			python3 -c 'import sys; m,w,s,t0,b0,cr,t1,b1=sys.argv[1:]; print("| %s | %s | %s | %.3f s (%.2f) | %d MB | %.3f s (%.2f) | %.2fx |" % (m,w,s,float(t0),float(b0),int(float(cr))//1000000,float(t1),float(b1),float(t0)/float(t1)))' \
				"$m" "$w" "$s" "$t0" "$b0" "$cr" "$t1" "$b1"
		done
	done
	;;
grid)
	out=$(mktemp)
	for m in $("$bin" models | awk 'NR > 1 && $1 != "toy3" {print $1}'); do
		for cs in 1 4 8; do
			for bw in 1Gbps 10Gbps; do
				for c in 4:8 8:8 16:16 32:8 6:12 12:6; do
					w=${c%%:*} s=${c##*:}
					f=(--model "$m" --workers "$w" --servers "$s" --bandwidth "$bw" --compute-scale "$cs")
					read -r _ t0 _ < <(run 6 "${f[@]}" --credit 16MB)
					read -r _ t1 _ < <(run 6 "${f[@]}")
					python3 -c 'import sys; print(sys.argv[1], "%.3f" % (float(sys.argv[2]) / float(sys.argv[3])))' "$m compute x$cs $bw $w:$s" "$t0" "$t1" | tee -a "$out"
				done
			done
		done
	done
	python3 - "$out" <<'PY'
import statistics, sys
rows = [l.rsplit(" ", 1) for l in open(sys.argv[1]).read().splitlines()]
r = [float(x) for _, x in rows]
print("%d jobs: 16 MB / default min %.3f, median %.3f, max %.3f" % (len(r), min(r), statistics.median(r), max(r)))
print("slower with the default:", ", ".join("%s (%.3f)" % (j, float(x)) for j, x in rows if float(x) < 1) or "none")
PY
	rm -f "$out"
	;;
testbed)
	rounds=${2:-3}
	job=(--model resnet50 --workers 8 --servers 8 --bandwidth 1Gbps --compute-scale 8 --iterations 10)
	declare -A runs
	for r in $(seq "$rounds"); do
		for c in 16MB default; do
			extra=()
			if [ "$c" = 16MB ]; then extra=(--credit 16MB); fi
			out=$("$bin" launch --testbed abdc --congestion "${CONGESTION:-cubic}" "${job[@]}" "${extra[@]}" --json 2>/dev/null)
			t=$(verified_time "$out" "round $r credit $c")
			runs[$c]="${runs[$c]:-} $t"
			echo "round $r credit $c: $t s" >&2
		done
	done
	for c in 16MB default; do
		extra=()
		if [ "$c" = 16MB ]; then extra=(--credit 16MB); fi
		read -r cr p _ < <(run 10 "${job[@]}" "${extra[@]}")
		python3 -c 'import statistics,sys; c,cr,p=sys.argv[1:4]; m=statistics.median(map(float,sys.argv[4:])); print("credit %s (%d MB): measured %.3f s (median; rounds %s), simulated %.3f s" % (c, int(float(cr))//1000000, m, " ".join("%.3f" % float(x) for x in sys.argv[4:]), float(p)))' "$c" "$cr" "$p" ${runs[$c]}
	done
	;;
*)
	echo "usage: $0 table [MODELS] [CLUSTERS] [ITERATIONS] | grid | testbed [ROUNDS]" >&2
	exit 2
	;;
esac
