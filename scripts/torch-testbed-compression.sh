#!/usr/bin/env bash
# 16-bit gradients against DDP on the testbed (root), torch 2: 4 workers at
# 100 Mbit/s per host; DDP with its own all-reduce and with
# bf16_compress_hook; autobyte on ring all-reduce (DDP's own hosts) in
# float32 and with bf16 compression, and on parameter servers (4 hosts of
# their own) in float32 and with bf16 compression; medians of ROUNDS alternating rounds,
# for examples/torch_cnn.py, torchvision's ResNet-18 on 32x32 images (its
# communication dwarfs its compute here) and on 64x64 images of 200 classes,
# batch 128 (Tiny ImageNet's shape; compute about equal to communication).
# Writes OUT/NAME.json (scripts/torch_compare.py); docs/runtime.md "16-bit
# gradients and compression" holds the results. MODELS picks models by name
# (default: all of them).
#
#   sudo scripts/torch-testbed-compression.sh [OUT] [ROUNDS] [MODELS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-torch-compression} rounds=${2:-3} only=${3:-}
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 1MB --credit 4MB"
# Parameter servers at the launch's default credit for them (16 MB): a piece
# holds its credit until all 4 workers pushed it and its server answered,
# so 4 MB in flight cannot fill a worker's link in both directions.
pscfg="--partition 1MB --credit 16MB"
variants=(
  --variant "ddp=--arch allreduce | --backend ddp"
  --variant "ddp-bf16-hook=--arch allreduce | --backend ddp --ddp-sum bf16"
  --variant "ring=--arch allreduce $cfg | --backend autobyte"
  --variant "ring-bf16=--arch allreduce $cfg --compression bf16 | --backend autobyte"
  --variant "ps=--servers 4 $pscfg | --backend autobyte"
  --variant "ps-bf16=--servers 4 $pscfg --compression bf16 | --backend autobyte"
)
models=(
  "cnn|examples/torch_cnn.py --iterations 12 --warmup 4"
  "resnet18|examples/torch_resnet.py --model resnet18 --iterations 6 --warmup 2"
  "resnet18-64px|examples/torch_resnet.py --model resnet18 --image 64 --classes 200 --batch 128 --iterations 6 --warmup 2"
)
names=()
for m in "${models[@]}"; do names+=("${m%%|*}"); done
for want in $only; do
  [[ " ${names[*]} " == *" $want "* ]] || { echo "unknown model '$want' in MODELS; known: ${names[*]}" >&2; exit 2; }
done
for m in "${models[@]}"; do
  name=${m%%|*} cmd=${m#*|}
  [[ -z $only || " $only " == *" $name "* ]] || continue
  # shellcheck disable=SC2086 # cmd is a command line
  python3 scripts/torch_compare.py --rate 100Mbps --workers 4 --rounds "$rounds" --python "$py" \
    --out "$out/$name.json" "${variants[@]}" -- $cmd
done
