#!/usr/bin/env bash
# What 16-bit gradients cost in loss: MODEL (examples/torch_cnn.py, or
# torchvision's ResNet-18 through examples/torch_resnet.py), 4 workers, 200
# steps on loopback (the losses depend on the arithmetic, not on the
# network), images of noise plus a fixed template of their class
# (learnable), torch 2, same seed: DDP in float32 and with
# bf16_compress_hook, autobyte's ring in float32, bf16 and fp16, and its
# parameter servers in bf16. Writes OUT/NAME.json for each run and draws
# them with autobyte plot into OUT/losses.png (docs/img/compression-losses.png
# for the CNN, docs/img/compression-losses-resnet18.png for ResNet-18).
#
#   scripts/torch-compression-losses.sh [OUT] [STEPS] [WIDTH] [MODEL]
#
# WIDTH is the CNN's --width (default 32: 0.8M parameters, a quarter of
# the example's default compute, so six 200-step runs take minutes here).
# MODEL is cnn (default) or resnet18 (11.2M parameters, 3x32x32 images,
# batch 32; WIDTH does not apply).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-compression-losses} steps=${2:-200} width=${3:-32} model=${4:-cnn}
case $model in
  cnn) script=(examples/torch_cnn.py --width "$width") title="torch_cnn.py --width $width" ;;
  resnet18) script=(examples/torch_resnet.py --model resnet18) title="torch_resnet.py --model resnet18" ;;
  *) echo "torch-compression-losses.sh: MODEL must be cnn or resnet18, got '$model'" >&2; exit 2 ;;
esac
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
  $ab launch --workers 4 $launch -- "$py" "${script[@]}" --labels templates $flags --iterations "$steps" --warmup 1 --losses \
    | grep '^{' | tail -1 >"$out/$name.json"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%-14s final loss %.5f, mean of the last 20 %.5f" % (sys.argv[2], r["losses"][-1], sum(r["losses"][-20:])/20))' "$out/$name.json" "$name"
  plots+=("$name=$out/$name.json")
done
$ab plot --out "$out/losses.png" --title "$title --labels templates, 4 workers, torch 2" --ylabel "loss (rank 0)" "${plots[@]}"
echo "wrote $out/losses.png"
# The table of docs/runtime.md: each run's loss at steps 50 and 100, the
# mean of its last 20 and its largest difference from DDP in float32 over
# the first 50 steps.
python3 - "$out" "${runs[@]}" <<'EOF'
import json, sys
out, names = sys.argv[1], [r.split("|")[0] for r in sys.argv[2:]]
losses = {n: json.load(open(f"{out}/{n}.json"))["losses"] for n in names}
base = losses[names[0]]
print(f"| run | loss at step 50 | at 100 | mean of the last 20 | largest difference from {names[0]} in the first 50 steps |")
print("|---|---:|---:|---:|---:|")
for n in names:
    l = losses[n]
    at = lambda k: f"{l[k]:.4f}" if k < len(l) else "-"
    first = max(abs(a - b) for a, b in zip(l[:50], base[:50]))
    print(f"| {n} | {at(50)} | {at(100)} | {sum(l[-20:]) / len(l[-20:]):.4f} | {first:.3g} |")
EOF
