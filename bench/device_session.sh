#!/usr/bin/env bash
# One device call: GPU correctness (bench/gpu_check.sh) then the standard-workload race
# (bench/race.sh, D = 128, T = 4096 .. 32768). Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export FOXC=${FOXC:-.carry/foxc}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bench/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.log"
OUT=$OUT bench/race.sh 128 ${RACE_T:-4096 8192 16384 32768} 2>&1 | tee "$OUT/race.log"
