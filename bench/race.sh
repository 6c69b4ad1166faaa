#!/usr/bin/env bash
# The standard-workload race on the GPU machine (see ../shared/bench/WORKLOAD.md and
# BENCHMARKS.md): foxc (pruned and --no-prune) and the peers on the same inputs, one run.
# Usage: bench/race.sh [D] [T...]     needs target/release/foxc (built elsewhere and carried).
set -uo pipefail
cd "$(dirname "$0")/.."
FOXC=${FOXC:-target/release/foxc}
OUTDIR=${OUT:-/tmp/race}
mkdir -p "$OUTDIR"
D=${1:-128}; shift || true
TS=${*:-4096 8192 16384 32768}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUTDIR/gpu.txt"
for T in $TS; do
  B=$((32768 / T))
  shape="B=$B,H=16,T=$T,D=$D"
  in="/tmp/race_in_${T}_${D}.safetensors"
  "$FOXC" inputs examples/fox.attn --shape "$shape" --seed 0 -o "$in" >/dev/null || exit 1
  for rule in paper tight; do
    "$FOXC" bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters 50 \
      --prune-rule "$rule" --format csv | sed "s/^/foxc-$rule,/" | tee -a "$OUTDIR/foxc.csv"
  done
  python3 bench/peers.py "$in" --no-dense-flex ${PEERS_FLAGS:---no-ref} 2>&1 | tee -a "$OUTDIR/peers.csv"
done
