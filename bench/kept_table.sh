#!/usr/bin/env bash
# Kept-tile fraction of ACP for every rule of the table (`foxc rules`) on two workloads
# (issue 12): the standard workload (WORKLOAD.md: QK-normalized q, k; per-head gate logits) and
# a no-QK-norm, bursty-gate workload (bench/bursty_inputs.py: log-normal row norms, gates that
# remember with bursts of strong forgetting). H = 16, D = 128, B = 32768 / T, ln eps = -10.
# Runs on the CPU: `foxc mask` evaluates only the gate cumsum, the threshold and the block
# boundary (reference interpreter), about 10 s per (workload, T, rule) on 2 cores.
#
# usage: bench/kept_table.sh [T ...]        (default 4096 8192 16384 32768)
#   FOXC=path/to/foxc (default target/release/foxc), TILES=BMxBN (default 64x64), SEED=0
# Output: CSV `workload,T,B,rule,tiles,kept` on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
FOXC=${FOXC:-target/release/foxc}
TILES=${TILES:-64x64}
SEED=${SEED:-0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Every rule of the table: the lines `name: formula` of `foxc rules`.
rules=$("$FOXC" rules | sed -nE 's/^([a-z][a-z0-9-]*): .*/\1/p')
[ -n "$rules" ] || { echo "no rules listed by $FOXC rules" >&2; exit 2; }
echo "workload,T,B,rule,tiles,kept"
for T in ${*:-4096 8192 16384 32768}; do
  B=$((32768 / T))
  "$FOXC" inputs examples/fox.attn --shape "B=$B,H=16,T=$T,D=128" --seed "$SEED" -o "$tmp/standard.safetensors" >/dev/null
  python3 bench/bursty_inputs.py "$tmp/standard.safetensors" "$tmp/bursty.safetensors" --seed "$SEED"
  for w in standard bursty; do
    for rule in $rules; do
      kept=$("$FOXC" mask examples/fox.attn --inputs "$tmp/$w.safetensors" --png "$tmp/m.png" \
        --prune-rule "$rule" --tiles "$TILES" | sed -nE 's/.*kept ([0-9.]+) of causal tiles.*/\1/p')
      [ -n "$kept" ] || { echo "no kept fraction for $w T=$T $rule" >&2; exit 2; }
      echo "$w,$T,$B,$rule,$TILES,$kept"
    done
  done
done
