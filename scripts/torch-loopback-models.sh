#!/usr/bin/env bash
# The plugin's own cost where communication is cheap: torchvision's
# ResNet-18 and ResNet-50 through autobyte (ring all-reduce; 3 parameter
# servers, and 1, the usual count for one host) against DDP, 3 workers on unshaped loopback (every process on
# this machine), torch 2, medians of ROUNDS alternating rounds; autobyte
# both through shared memory (the default between processes of one host)
# and over TCP (launch --shm=false), as gloo is. Writes OUT/MODEL.json (scripts/torch_compare.py);
# docs/pytorch.md "Where communication is cheap" holds the results.
#
#   scripts/torch-loopback-models.sh [OUT] [ROUNDS] [MODELS] [VARIANTS]
#
# MODELS is a list of NAME:ITERATIONS:WARMUP (default
# "resnet18:30:5 resnet50:30:5"); the first WARMUP steps are left out.
# VARIANTS is a list of the variant names below (default all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-torch-loopback} rounds=${2:-3} models=${3:-"resnet18:30:5 resnet50:30:5"}
only=${4:-}
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 4MB --credit 16MB"
all=(
  "ddp=--arch allreduce | --backend ddp"
  "ring=--arch allreduce $cfg | --backend autobyte"
  "ps=--servers 3 $cfg | --backend autobyte"
  "ps-1server=--servers 1 $cfg | --backend autobyte"
  "ring-tcp=--arch allreduce $cfg --shm=false | --backend autobyte"
  "ps-tcp=--servers 3 $cfg --shm=false | --backend autobyte"
)
names=" ${all[*]%%=*} "
for n in $only; do
  if [[ $names != *" $n "* ]]; then
    echo "torch-loopback-models.sh: no variant named '$n' (have:$names)" >&2
    exit 2
  fi
done
variants=()
for v in "${all[@]}"; do
  if [[ -z $only || " $only " == *" ${v%%=*} "* ]]; then
    variants+=(--variant "$v")
  fi
done
for spec in $models; do
  IFS=: read -r m iters warm <<<"$spec"
  python3 scripts/torch_compare.py --loopback --workers 3 --rounds "$rounds" --python "$py" \
    --out "$out/$m.json" "${variants[@]}" -- examples/torch_resnet.py --model "$m" --iterations "$iters" --warmup "$warm"
done
