#!/usr/bin/env bash
# The plugin's own cost where communication is cheap: torchvision's
# ResNet-18 and ResNet-50 through autobyte (ring all-reduce and 3 parameter
# servers, without and with tensor fusion; the ring also with the engine's
# Go runtime on one processor, GOMAXPROCS=1) against DDP, 3 workers on
# unshaped loopback (every process on this machine), torch 2, medians of
# ROUNDS alternating rounds. Writes OUT/NAME.json (scripts/torch_compare.py);
# docs/pytorch.md "Where communication is cheap" holds the results.
#
#   scripts/torch-loopback-models.sh [OUT] [ROUNDS] [FUSION]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-torch-loopback} rounds=${2:-3} fusion=${3:-1MB}
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 4MB --credit 16MB"
variants=(
  --variant "ddp=--arch allreduce | --backend ddp"
  --variant "ring=--arch allreduce $cfg | --backend autobyte"
  --variant "ring-fused=--arch allreduce $cfg --fusion $fusion | --backend autobyte"
  --variant "ring-fused-1p=--arch allreduce $cfg --fusion $fusion | --backend autobyte | GOMAXPROCS=1"
  --variant "ps=--servers 3 $cfg | --backend autobyte"
  --variant "ps-fused=--servers 3 $cfg --fusion $fusion | --backend autobyte"
)
for m in resnet18 resnet50; do
  python3 scripts/torch_compare.py --loopback --workers 3 --rounds "$rounds" --python "$py" \
    --out "$out/$m.json" "${variants[@]}" -- examples/torch_resnet.py --model $m --iterations 10 --warmup 3
done
