#!/usr/bin/env bash
# The plugin against DDP on the testbed (root) with real models, on both
# supported torch versions: torchvision's ResNet-18 and a small GPT-2, 4
# workers at 100 Mbit/s per host, autobyte on parameter servers (4 hosts of
# their own) and on ring all-reduce (DDP's own hosts), medians of ROUNDS
# alternating rounds. Writes OUT/NAME-TORCH.json (scripts/torch_compare.py)
# and prints each run; docs/pytorch.md "Real models on the testbed" holds
# the results.
#
#   sudo scripts/torch-testbed-models.sh [OUT] [ROUNDS] [RUNS]
#
# RUNS picks TORCH:MODEL pairs (default "113:resnet18 113:gpt2 2:resnet18
# 2:gpt2"). TORCH113 and TORCH2 (environment) are the interpreters: by
# default the venvs .ci/run creates.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/autobyte-torch-models} rounds=${2:-3} runs=${3:-"113:resnet18 113:gpt2 2:resnet18 2:gpt2"}
mkdir -p "$out"
torch113=${TORCH113:-${AUTOBYTE_TORCH113_VENV:-$HOME/.cache/autobyte/torch113-venv}/bin/python}
torch2=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
cfg="--partition 1MB --credit 4MB"
variants=(
  --variant "ddp=--arch allreduce | --backend ddp"
  --variant "ps=--servers 4 $cfg | --backend autobyte"
  --variant "ring=--arch allreduce $cfg | --backend autobyte"
)
# ResNet-18: 11.2M parameters (45 MB of gradients), 3x32x32 images, batch 32.
# GPT-2 with 4 layers of width 256 and GPT-2's vocabulary and positions:
# 16.3M parameters (65 MB), 64 tokens, batch 2 (compute near the transfer
# time; 128 tokens in batches of 4 compute for 27 s a step with 4 workers on
# these 2 cores). GPT-2 small's 124M would
# take about a minute a step here on the network alone (500 MB at 12.5 MB/s).
declare -A models=(
  [resnet18]="examples/torch_resnet.py --model resnet18 --iterations 6 --warmup 2"
  [gpt2]="examples/torch_gpt2.py --layers 4 --dim 256 --heads 4 --seq 64 --batch 2 --iterations 6 --warmup 2"
)
declare -A pythons=([113]="$torch113" [2]="$torch2")
for r in $runs; do
  t=${r%%:*} name=${r#*:}
  py=${pythons[$t]:?"RUNS: unknown torch $t in $r (want 113 or 2)"}
  cmd=${models[$name]:?"RUNS: unknown model $name in $r (want resnet18 or gpt2)"}
  v=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
  # shellcheck disable=SC2086 # cmd is a command line
  python3 scripts/torch_compare.py --rate 100Mbps --workers 4 --rounds "$rounds" --python "$py" \
    --out "$out/$name-$v.json" "${variants[@]}" -- $cmd
done
