#!/usr/bin/env bash
# A short device call: correctness of the current binary on a few shapes, then the race at
# the given T values (default 4096 and 32768), D = 128.
set -uo pipefail
cd "$(dirname "$0")/.."
export FOXC=${FOXC:-.carry/foxc}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for a in "B=8,H=16,T=4096,D=128" "B=1,H=1,T=777,D=64" "B=2,H=16,T=16384,D=64" "B=1,H=3,T=1000,D=128 --prune-rule tight"; do
  echo "### $a"; $FOXC run examples/fox.attn --backend cuda --check --shape $a 2>&1 | grep -E "time|check|error"
done
OUT=$OUT bench/race.sh 128 ${RACE_T:-4096 32768} 2>&1 | tee "$OUT/race.log"
