#!/usr/bin/env bash
# Emit the PTX of every example that compiles to a GPU kernel and assemble it with ptxas
# for sm_90a and sm_80 at every head dimension the GPU kernel takes (D = 32, 64, 96, 128, 256),
# then the PTX of every example's gradient program (the backward kernels `foxc grad` runs) at
# D = 64 and 128. Invalid PTX fails; spills are printed (D = 256 on the mma.sync path may spill).
set -euo pipefail
cd "$(dirname "$0")/.."
PTXAS=${PTXAS:-.tools/nvcc/nvidia/cu13/bin/ptxas}
FOXC=${FOXC:-target/debug/foxc}
[ -x "$FOXC" ] || cargo build --quiet --bin foxc
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=0
# assemble FILE TARGET SHAPE LABEL FLAGS...: `foxc compile FILE --target TARGET --shape SHAPE
# FLAGS` (FLAGS include the --emit) into PTX, then ptxas; prints `ok: LABEL` (and any spills).
# Returns 2 when foxc cannot emit it (its error in $out/err), exits on a ptxas failure.
assemble() {
  local f=$1 target=$2 shape=$3 label=$4 spill
  shift 4
  local ptx="$out/a.ptx"
  "$FOXC" compile "$f" --target "$target" --shape "$shape" "$@" -o "$ptx" 2>"$out/err" || return 2
  "$PTXAS" -arch="$target" -v "$ptx" -o "$out/a.cubin" 2>"$out/ptxas.log" || { echo "FAIL: ptxas $label"; cat "$out/ptxas.log"; exit 1; }
  spill=$(grep -E "spill" "$out/ptxas.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" || true)
  echo "ok: $label${spill:+  (spills: $spill)}"
  n=$((n+1))
}
for f in examples/*.attn; do
  name=$(basename "$f" .attn)
  for target in sm_90a sm_80; do
    for d in ${DIMS:-32 64 96 128 256}; do
      # Grouped-query kernels are specialized on the heads per key/value head (H / G).
      shape="D=$d"
      case "$name" in *gqa*) shape="$shape,H=4,G=2";; esac
      # The warp-specialized kernel where the pass keeps the standard one (D = 64 on sm_90a).
      kernels=default
      [ "$target" = sm_90a ] && [ "$d" = 64 ] && kernels="default warp-specialized"
      for k in $kernels; do
        flags=(); [ "$k" = default ] || flags=(--attn-kernel "$k")
        if ! assemble "$f" "$target" "$shape" "$name $target D=$d${flags[*]:+ ${flags[*]}}" --emit ptx "${flags[@]}"; then
          case "$name" in refuse_*) echo "skip: $name (not pruned by the passes; GPU backend: $(head -n 1 "$out/err"))"; continue 3;; esac
          echo "FAIL: foxc could not emit PTX for $f ($target, D=$d, $k):"; cat "$out/err"; exit 1
        fi
      done
    done
  done
done
for f in examples/*.attn; do
  name=$(basename "$f" .attn)
  for target in sm_90a sm_80; do
    for d in ${GRAD_DIMS:-64 128}; do
      shape="D=$d"
      case "$name" in *gqa*) shape="$shape,H=4,G=2";; esac
      if ! assemble "$f" "$target" "$shape" "$name $target D=$d gradient" --emit grad-ptx; then
        echo "FAIL: foxc could not emit the gradient program's PTX for $f ($target, D=$d):"; cat "$out/err"; exit 1
      fi
    done
  done
done
echo "ptxas: $n PTX modules assembled"
