#!/usr/bin/env bash
# The plugin's engine library at several commits, against DDP, on unshaped
# loopback: each REV's libautobyte.so is built in a temporary git worktree,
# and every build runs the same Python (this checkout's) through
# AUTOBYTE_LIB, so only the engine differs. 3 workers, torch 2, the ring
# (ARCH=allreduce, the default) or parameter servers (ARCH=ps: 3 servers),
# 4 MB partitions and 16 MB credit; rounds alternate DDP and the builds.
# Each run reports rank 0's CPU per step, all threads and the training
# thread's (the rest is the engine's or gloo's). Writes OUT/MODEL.json
# (scripts/torch_compare.py).
#
#   scripts/torch-loopback-ab.sh OUT ROUNDS MODEL:ITERATIONS:WARMUP REV...
#   scripts/torch-loopback-ab.sh /tmp/ab 3 resnet50:14:3 429a12e e77a29b
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 OUT ROUNDS MODEL:ITERATIONS:WARMUP REV... (at least one REV)"
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
out=$1 rounds=$2 spec=$3
shift 3
IFS=: read -r model iters warm <<<"$spec"
[ -n "$model" ] && [ -n "$iters" ] && [ -n "$warm" ] || { echo "$usage: bad model spec '$spec'" >&2; exit 2; }
arch=${ARCH:-allreduce}
case $arch in
  allreduce) where="--arch allreduce" ;;
  ps) where="--servers 3" ;;
  *) echo "ARCH must be allreduce or ps, got '$arch'" >&2; exit 2 ;;
esac
mkdir -p "$out"
py=${TORCH2:-${AUTOBYTE_TORCH2_VENV:-$HOME/.cache/autobyte/torch2-venv}/bin/python}
tmp=$(mktemp -d /tmp/torch-loopback-ab.XXXXXX)
cleanup() {
  for d in "$tmp"/wt-*; do [ -d "$d" ] && git worktree remove --force "$d" >/dev/null 2>&1; done
  rm -rf "$tmp"
}
trap cleanup EXIT
variants=(--variant "ddp=--arch allreduce | --backend ddp")
for i in $(seq 1 $#); do
  rev=${!i}
  git worktree add --detach "$tmp/wt-$i" "$rev" >/dev/null 2>&1 ||
    { echo "torch-loopback-ab: cannot check out $rev" >&2; exit 1; }
  (cd "$tmp/wt-$i" && go build -buildmode=c-shared -o "$tmp/lib-$i.so" ./cmd/libautobyte)
  variants+=(--variant "$arch-$rev=$where --partition 4MB --credit 16MB | --backend autobyte | AUTOBYTE_LIB=$tmp/lib-$i.so")
done
python3 scripts/torch_compare.py --loopback --workers 3 --rounds "$rounds" --python "$py" --out "$out/$model.json" \
  "${variants[@]}" -- examples/torch_resnet.py --model "$model" --iterations "$iters" --warmup "$warm"
