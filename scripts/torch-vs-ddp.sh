#!/usr/bin/env bash
# A PyTorch example under autobyte and under torch DDP (gloo) on the same
# testbed (root): each host is a network namespace with its rate shaped by
# tc, one worker per host; all-reduce runs on exactly the hosts DDP uses,
# parameter servers (if asked for) get hosts of their own. Rounds alternate
# the backends so load on the machine hits both alike; prints each run,
# the medians and the ratio (scripts/torch_compare.py, for more variants).
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
exec /usr/bin/python3 scripts/torch_compare.py --rate "$rate" --workers "$workers" --rounds "$rounds" --python "$python" \
  --variant "ddp=--arch allreduce | --backend ddp" --variant "autobyte=${flags[*]} | --backend autobyte" \
  -- "$script" $args
