#!/usr/bin/env bash
# A PyTorch example under autobyte and under torch DDP (gloo) on the same
# testbed (root): each host is a network namespace with its rate shaped by
# tc, one worker per host; all-reduce runs on exactly the hosts DDP uses,
# parameter servers (if asked for) get hosts of their own. Rounds alternate
# the backends so load on the machine hits both alike; prints each run,
# the medians and the ratio.
#
#   sudo scripts/torch-vs-ddp.sh [SCRIPT] [RATE] [WORKERS] [ROUNDS] [AUTOBYTE LAUNCH FLAGS...]
#   sudo scripts/torch-vs-ddp.sh examples/torch_cnn.py 150Mbps 3 5 --arch allreduce --partition 256KB --credit 1MB
#
# SCRIPT_ARGS (environment) are passed to the script (default: --iterations
# 20 --warmup 5). PYTHON (environment) is the interpreter that runs it
# (default /usr/bin/python3), e.g. a venv's for another torch:
#
#   sudo PYTHON=~/.cache/autobyte/torch2-venv/bin/python scripts/torch-vs-ddp.sh examples/torch_resnet.py 100Mbps 4 3 --servers 4
set -euo pipefail
cd "$(dirname "$0")/.."
script=${1:-examples/torch_cnn.py} rate=${2:-150Mbps} workers=${3:-3} rounds=${4:-5}
shift $(( $# < 4 ? $# : 4 ))
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--arch allreduce --partition 256KB --credit 1MB)
args=${SCRIPT_ARGS:---iterations 20 --warmup 5}
python=${PYTHON:-/usr/bin/python3}
torch_version=$("$python" -c 'import torch; print(torch.__version__)')
echo "$script $args, $workers workers at $rate, $python (torch $torch_version)"
go build -o /tmp/autobyte-torch ./cmd/autobyte
ab=/tmp/autobyte-torch
bed=abtorch
$ab testbed up --name $bed --hosts $((2 * workers)) --rate "$rate" >/dev/null
trap '$ab testbed down --name $bed >/dev/null 2>&1 || true' EXIT
run() { # backend, launch flags...
  local b=$1; shift
  $ab launch --testbed $bed --bandwidth "$rate" --workers "$workers" "$@" -- "$python" "$script" --backend "$b" $args 2>/dev/null |
    tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])'
}
ours=() theirs=()
for r in $(seq "$rounds"); do
  a=$(run autobyte "${flags[@]}"); d=$(run ddp --arch allreduce)
  ours+=("$a"); theirs+=("$d")
  printf "round %d: autobyte %.3f s  ddp %.3f s  ratio %.2f\n" "$r" "$a" "$d" "$(awk -v a="$a" -v d="$d" 'BEGIN{print d/a}')"
done
/usr/bin/python3 - "${ours[*]}" "${theirs[*]}" "$script" "$rate" "$workers" "${flags[*]}" "$args" "$torch_version" <<'PY'
import json, statistics, sys
a = [float(x) for x in sys.argv[1].split()]
d = [float(x) for x in sys.argv[2].split()]
ma, md = statistics.median(a), statistics.median(d)
print("median: autobyte %.3f s, ddp %.3f s -> autobyte is %.2fx faster" % (ma, md, md / ma))
print(json.dumps({"script": sys.argv[3], "rate": sys.argv[4], "workers": int(sys.argv[5]), "autobyte_flags": sys.argv[6],
                  "script_args": sys.argv[7], "torch": sys.argv[8], "ratios": [y / x for x, y in zip(a, d)],
                  "autobyte_s": a, "ddp_s": d, "median_autobyte_s": ma, "median_ddp_s": md, "speedup": md / ma}))
PY
