#!/usr/bin/env bash
# The plugin's own cost where communication is cheap: torchvision's
# ResNet-18 and ResNet-50 through autobyte (ring all-reduce and 3 parameter
# servers) against DDP, 3 workers on unshaped loopback (every process on
# this machine), torch 2, medians of ROUNDS alternating rounds; autobyte
# both through shared memory (the default between processes of one host)
# and over TCP (launch --shm=false), as gloo is. Writes OUT/MODEL.json (scripts/torch_compare.py);
# docs/pytorch.md "Where communication is cheap" holds the results.
#
#   scripts/torch-loopback-models.sh [OUT] [ROUNDS] [MODELS]
#
# MODELS is a list of NAME:ITERATIONS:WARMUP (default
# "resnet18:30:5 resnet50:12:3"); the first WARMUP steps are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-torch-loopback} rounds=${2:-3} models=${3:-"resnet18:30:5 resnet50:12:3"}
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 4MB --credit 16MB"
variants=(
  --variant "ddp=--arch allreduce | --backend ddp"
  --variant "ring=--arch allreduce $cfg | --backend autobyte"
  --variant "ps=--servers 3 $cfg | --backend autobyte"
  --variant "ring-tcp=--arch allreduce $cfg --shm=false | --backend autobyte"
  --variant "ps-tcp=--servers 3 $cfg --shm=false | --backend autobyte"
)
for spec in $models; do
  IFS=: read -r m iters warm <<<"$spec"
  python3 scripts/torch_compare.py --loopback --workers 3 --rounds "$rounds" --python "$py" \
    --out "$out/$m.json" "${variants[@]}" -- examples/torch_resnet.py --model "$m" --iterations "$iters" --warmup "$warm"
done
