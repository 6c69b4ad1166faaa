#!/usr/bin/env bash
# Kept-tile fraction of ACP on the standard workload (H = 16, D = 128, B = 32768 / T) for both
# threshold rules and three tile shapes (issue 3, item 7). Runs on the CPU: only the gate
# cumsum, the threshold and the block boundary are evaluated (reference interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
FOXC=${FOXC:-target/release/foxc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "T,B,rule,tiles,kept_tiles"
for T in ${*:-4096 8192 16384 32768}; do
  B=$((32768 / T))
  "$FOXC" inputs examples/fox.attn --shape "B=$B,H=16,T=$T,D=128" --seed 0 -o "$tmp/in.safetensors" >/dev/null
  for rule in paper tight; do
    for tiles in 64x64 128x64 128x128; do
      kept=$("$FOXC" mask examples/fox.attn --inputs "$tmp/in.safetensors" --png "$tmp/m.png" \
        --prune-rule "$rule" --tiles "$tiles" | sed -E 's/.*kept ([0-9.]+) of causal tiles.*/\1/')
      echo "$T,$B,$rule,$tiles,$kept"
    done
  done
done
