#!/usr/bin/env bash
# Issue 11, run 10 (h6-prologue, docs/GPU_KERNEL.md "Run 10"): the warp-specialized forward's
# fixed cost per block (start search overlapped with the first loads, split over the warps;
# bf16 output through shared memory) against the build before it, on the same card in one call.
# Binaries (built here, stripped, gzipped; carry both folders): FOXC_BASE (default
# .devbin/s4/foxc.gz, main at 416de6e) and FOXC_NEW (default .devbin/h6/foxc.gz).
# Steps, every command under `timeout`, everything into ONE log ($OUT/ws10.log):
#   (a) `foxc run --backend cuda --check` of the new build (fox at T = 64, 130, 777, 8291,
#       D = 128, default and --no-prune; fox_gqa, fox_softcap, window, fox_keybias at D = 128);
#   (b) new vs base on the same inputs: every output tensor bitwise equal (same arithmetic);
#   (c) compute-sanitizer memcheck and racecheck of the new build on small D = 128 shapes;
#   (d) `foxc bench --iters 50` (pruned and dense rows) base and new interleaved, ROUNDS (2)
#       rounds, at SHAPES.
# Knobs: CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; ROUNDS, SHAPES, ITERS; NCU=1 adds ncu
# sections of one new attention launch at NCU_SHAPE (default 1x16x32768x128).
# Prints "ws10: all checks passed" or "ws10: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/ws10_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/ws10.log") 2>&1
source bench/device_lib.sh  # unpack, t, compare_outputs
BASE=$(unpack "${FOXC_BASE:-.devbin/s4/foxc.gz}")
NEW=$(unpack "${FOXC_NEW:-.devbin/h6/foxc.gz}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0

echo "## (a) correctness of the new build: --backend cuda --check"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=64,D=128" "fox B=1,H=2,T=130,D=128" "fox B=1,H=3,T=777,D=128" \
    "fox B=1,H=1,T=8291,D=128" "fox_gqa B=1,H=4,G=2,T=1000,D=128" "fox_softcap B=1,H=4,T=1000,D=128" \
    "window B=1,H=4,T=1000,D=128" "fox_keybias B=1,H=4,T=1000,D=128"; do
    set -- $c
    extras=("")
    [ "$1" = fox ] && extras=("" "--no-prune")
    for x in "${extras[@]}"; do
      check_cuda "$NEW" run "$1" "$2" $x || { fail=1; echo "FAILED: check $1 $2 $x"; }
    done
  done
fi

echo "## (b) new vs base, same inputs: bitwise equal outputs"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=2,H=4,T=2051,D=128 -" "fox B=1,H=2,T=8291,D=128 -" "fox B=1,H=2,T=4099,D=128 --no-prune" \
    "fox_keybias B=1,H=4,T=1000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    compare_runs "$1" "$2" "$BASE" "$x" "$NEW" "$x" || { fail=1; echo "FAILED: compare $1 $2 $x"; }
  done
fi

echo "## (c) compute-sanitizer on the new build (warp-specialized kernel, D = 128)"
if [ "${SAN:-1}" = 1 ]; then
  for c in "memcheck B=1,H=2,T=300,D=128" "racecheck B=1,H=2,T=300,D=128"; do
    set -- $c
    sanitize "$1" "$NEW" "$2" || { fail=1; echo "FAILED: $1 $2"; }
  done
fi

echo "## (d) timings: foxc bench --iters ${ITERS:=50}, base and new interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128 B=1,H=1,T=16384,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for v in base new; do
        bin=$BASE; [ $v = new ] && bin=$NEW
        bench_rows "$v,r$round" "$bin" "$s"
      done
    done
  done | tee "$OUT/ws10_ab.csv"
fi
# NCU=1: ncu sections of one new attention launch at NCU_SHAPE (off by default: ~1-2 min).
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "## ncu: the new build's attention kernel at ${NCU_SHAPE:=B=1,H=16,T=32768,D=128}"
  t 200 ncu -k regex:foxc_attn_fwd --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$NEW" run examples/fox.attn --backend cuda --shape "$NCU_SHAPE" --seed 0 >"$OUT/ncu_new.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Achieved Occupancy|cycles_active|warps_active|time_duration|Registers Per|Stall|stall|Issue Slots|No Eligible|Eligible Warps" "$OUT/ncu_new.txt" | head -30
fi
echo "ws10: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
