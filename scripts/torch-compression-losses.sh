#!/usr/bin/env bash
# What 16-bit gradients cost in loss: examples/torch_cnn.py, 4 workers, 200
# steps on loopback (the losses depend on the arithmetic, not on the
# network), images of noise plus a fixed template of their class (learnable), torch 2, same seed: DDP in float32 and with bf16_compress_hook,
# autobyte's ring in float32, bf16 and fp16, and its parameter servers in
# bf16. Writes OUT/NAME.json for each run and draws them with autobyte plot
# into OUT/losses.png (docs/img/compression-losses.png).
#
#   scripts/torch-compression-losses.sh [OUT] [STEPS] [WIDTH]
#
# WIDTH is the CNN's --width (default 32: 0.8M parameters, a quarter of
# the example's default compute, so six 200-step runs take minutes here).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-compression-losses} steps=${2:-200} width=${3:-32}
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
ab=/tmp/autobyte-compression-losses-bin
go build -o $ab ./cmd/autobyte
cfg="--partition 1MB --credit 4MB"
runs=(
  "ddp-fp32|--arch allreduce|--backend ddp"
  "ddp-bf16-hook|--arch allreduce|--backend ddp --ddp-sum bf16"
  "ring-fp32|--arch allreduce $cfg|--backend autobyte"
  "ring-bf16|--arch allreduce $cfg --compression bf16|--backend autobyte"
  "ring-fp16|--arch allreduce $cfg --compression fp16|--backend autobyte"
  "ps-bf16|--servers 4 $cfg --compression bf16|--backend autobyte"
)
plots=()
for r in "${runs[@]}"; do
  IFS='|' read -r name launch flags <<<"$r"
  # shellcheck disable=SC2086 # launch and flags are command lines
  $ab launch --workers 4 $launch -- "$py" examples/torch_cnn.py --width "$width" --labels templates $flags --iterations "$steps" --warmup 1 --losses \
    | grep '^{' | tail -1 >"$out/$name.json"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%-14s final loss %.5f, mean of the last 20 %.5f" % (sys.argv[2], r["losses"][-1], sum(r["losses"][-20:])/20))' "$out/$name.json" "$name"
  plots+=("$name=$out/$name.json")
done
$ab plot --out "$out/losses.png" --title "torch_cnn.py --width $width --labels templates, 4 workers, torch 2" --ylabel "loss (rank 0)" "${plots[@]}"
echo "wrote $out/losses.png"
