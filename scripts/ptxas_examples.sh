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
        ptx="$out/$name.$target.d$d.$k.ptx"
        flags=(); [ "$k" = default ] || flags=(--attn-kernel "$k")
        if ! "$FOXC" compile "$f" --emit ptx --target "$target" --shape "$shape" "${flags[@]}" -o "$ptx" 2>"$out/err"; then
          case "$name" in refuse_*) echo "skip: $name (not pruned by the passes; GPU backend: $(head -n 1 "$out/err"))"; continue 3;; esac
          echo "FAIL: foxc could not emit PTX for $f ($target, D=$d, $k):"; cat "$out/err"; exit 1
        fi
        "$PTXAS" -arch="$target" -v "$ptx" -o "$out/a.cubin" 2>"$out/ptxas.log" || { echo "FAIL: ptxas $ptx"; cat "$out/ptxas.log"; exit 1; }
        spill=$(grep -E "spill" "$out/ptxas.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" || true)
        echo "ok: $name $target D=$d${flags[*]:+ ${flags[*]}}${spill:+  (spills: $spill)}"
        n=$((n+1))
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
      ptx="$out/$name.$target.d$d.grad.ptx"
      if ! "$FOXC" compile "$f" --emit grad-ptx --target "$target" --shape "$shape" -o "$ptx" 2>"$out/err"; then
        echo "FAIL: foxc could not emit the gradient program's PTX for $f ($target, D=$d):"; cat "$out/err"; exit 1
      fi
      "$PTXAS" -arch="$target" -v "$ptx" -o "$out/a.cubin" 2>"$out/ptxas.log" || { echo "FAIL: ptxas $ptx"; cat "$out/ptxas.log"; exit 1; }
      spill=$(grep -E "spill" "$out/ptxas.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" || true)
      echo "ok: $name $target D=$d gradient${spill:+  (spills: $spill)}"
      n=$((n+1))
    done
  done
done
echo "ptxas: $n PTX modules assembled"
