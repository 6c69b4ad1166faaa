#!/usr/bin/env bash
# Issue 11 item 1 (h8-tma): K and V through the tensor memory accelerator in the warp-specialized
# forward (`--ws-loads tma`) against the cp.async producer (`--ws-loads cp-async`), ONE binary.
# Binary (built here from a clean tree, stripped, gzipped; carry its folder): FOXC_NEW (or FOXC;
# default .devbin/h8/foxc.gz). Budget: ~2 min.
# Steps, every command under `timeout`, everything into ONE log ($OUT/tma.log):
#   (0) the PTX really differs: `compile --emit ptx` has cp.async.bulk.tensor with tma only;
#   (a) `foxc run --backend cuda --check --ws-loads tma`: fox at T = 64, 130, 777, 8291, D = 128,
#       pruned (and --no-prune at 777 and 8291); fox_gqa, window, fox_keybias, fox_softcap at
#       D = 128. (D = 64 is
#       not reachable from the CLI: the tiles pass keeps D = 64 on the standard kernel.)
#   (b) tma vs cp-async on the same inputs: every output tensor bitwise equal (same arithmetic,
#       the same bytes in shared memory; rows past T are zeros instead of copies of row T - 1,
#       masked either way);
#   (c) compute-sanitizer memcheck and racecheck with tma on small D = 128 shapes;
#   (d) `foxc bench --iters 50` (pruned and dense rows) cp-async and tma interleaved, ROUNDS (2)
#       rounds, at SHAPES.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "tma: all checks passed" or "tma: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/tma_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/tma.log") 2>&1
source bench/device_lib.sh  # unpack, t, compare_outputs
F=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h8/foxc.gz}}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0

echo "## (0) the tma kernel is the one compiled"
if [ "${PTX:-1}" = 1 ]; then
  for l in tma cp-async; do
    n=$(t 60 "$F" compile examples/fox.attn --target sm_90a --shape D=128 --emit ptx --ws-loads $l |
      grep -c 'cp.async.bulk.tensor')
    echo "ptx --ws-loads $l: $n cp.async.bulk.tensor lines"
    { [ $l = tma ] && [ "$n" -gt 0 ]; } || { [ $l = cp-async ] && [ "$n" -eq 0 ]; } ||
      { fail=1; echo "FAILED: ptx $l"; }
  done
fi

echo "## (a) correctness with tma: --backend cuda --check --ws-loads tma"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=64,D=128" "fox B=1,H=2,T=130,D=128" "fox B=1,H=3,T=777,D=128" \
    "fox B=1,H=1,T=8291,D=128" "fox_gqa B=1,H=4,G=2,T=1000,D=128" "fox_softcap B=1,H=4,T=1000,D=128" \
    "window B=1,H=4,T=1000,D=128" "fox_keybias B=1,H=4,T=1000,D=128"; do
    set -- $c
    extras=("")
    case "$2" in *T=777,* | *T=8291,*) [ "$1" = fox ] && extras=("" "--no-prune") ;; esac
    for x in "${extras[@]}"; do
      check_cuda "$F" run "$1" "$2" --ws-loads tma $x || { fail=1; echo "FAILED: check $1 $2 $x"; }
    done
  done
fi

echo "## (b) tma vs cp-async, same binary, same inputs: bitwise equal outputs"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=2,H=4,T=2051,D=128 -" "fox B=1,H=2,T=4099,D=128 --no-prune" "fox B=1,H=2,T=64,D=128 -" \
    "fox_gqa B=2,H=4,G=2,T=1000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    compare_runs "$1" "$2" "$F" "$x --ws-loads cp-async" "$F" "$x --ws-loads tma" || { fail=1; echo "FAILED: compare $1 $2 $x"; }
  done
fi

echo "## (c) compute-sanitizer with tma (warp-specialized kernel, D = 128)"
if [ "${SAN:-1}" = 1 ]; then
  for c in "memcheck fox B=1,H=2,T=300,D=128" "racecheck fox B=1,H=2,T=300,D=128"; do
    set -- $c
    sanitize "$1" "$F" "$3" --ws-loads tma || { fail=1; echo "FAILED: $1 $2 $3"; }
  done
fi

echo "## (d) timings: foxc bench --iters ${ITERS:=50}, cp-async and tma interleaved (loads,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=4,H=16,T=8192,D=128 B=1,H=16,T=32768,D=128 B=1,H=1,T=16384,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for l in cp-async tma; do
        bench_rows "$l,r$round" "$F" "$s" --ws-loads $l
      done
    done
  done | tee "$OUT/tma_ab.csv"
fi
echo "tma: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
