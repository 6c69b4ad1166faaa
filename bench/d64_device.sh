#!/usr/bin/env bash
# Issue 11 item 2 (h9-d64, GPU_KERNEL.md run 13): the warp-specialized forward at D = 64 with two
# blocks per SM (64-key tiles: `.minnctapersm 2`, 24 / 104 registers after setmaxnreg, 4 slots of
# 83 KB per block; 128-key tiles keep one block per SM) against the standard kernel, ONE binary:
# `--attn-kernel standard|warp-specialized` (the tiles pass's own choice at D = 64 is standard).
# Binary (built here, stripped, gzipped; carry its folder): FOXC_NEW (or FOXC; default
# .devbin/h9/foxc.gz). Budget: ~3.5 min.
# Steps, every command under `timeout`, everything into ONE log ($OUT/d64.log):
#   (0) the PTX is the one meant: ws D = 64 64x64 has `.minnctapersm 2` and `setmaxnreg.inc 104`,
#       64x128 `.minnctapersm 1`; without the flag D = 64 compiles no `_ws_` kernel;
#   (a) `run --backend cuda --check`, ws forced: fox D = 64 at T = 64, 130, 777, 8291, pruned and
#       --no-prune, tiles 64x64 and 64x128; fox_gqa, window, fox_softcap, fox_keybias at T = 1000;
#   (b) standard vs ws on the same inputs (fox 2x8x8291x64, pruned and --no-prune, 64x64):
#       rel L2 < 5e-3 required (run 8 found them bitwise equal at D = 128; printed);
#   (c) compute-sanitizer memcheck and racecheck of the ws D = 64 kernel at 1x66x512x64 (264
#       blocks, more than one per SM);
#   (d) `foxc bench --iters 20` (pruned and dense rows) standard and ws at 64x64 and 64x128,
#       interleaved, ROUNDS (2) rounds (round 2 without standard 64x128, and only before BUDGET
#       seconds, default 170, have passed), at SHAPES;
#   (e) ncu of the ws and the standard D = 64 kernel at 1x16x32768x64: registers, occupancy
#       limits, achieved warps, tensor pipe.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 / NCU=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "d64: all checks passed" or "d64: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/d64_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/d64.log") 2>&1
source bench/device_lib.sh  # unpack, t, check_cuda, compare_runs, sanitize, bench_rows
F=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h9/foxc.gz}}")
WS="--attn-kernel warp-specialized"
STD="--attn-kernel standard"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
stamp() { echo "## $(date -u +%T) $*"; }

stamp "(0) the PTX of each variant"
if [ "${PTX:-1}" = 1 ]; then
  ptx() { t 60 "$F" compile examples/fox.attn --target sm_90a --shape D=64 --emit ptx "$@"; }
  p=$(ptx $WS --tiles 64x64)
  n=$(grep -cE '\.minnctapersm 2|setmaxnreg\.inc\.sync\.aligned\.u32[[:space:]]+104;' <<<"$p")
  echo "ptx ws 64x64: $n of 2 lines (.minnctapersm 2, setmaxnreg.inc 104)"
  [ "$n" -eq 2 ] || { fail=1; echo "FAILED: ptx ws 64x64"; }
  n=$(ptx $WS --tiles 64x128 | grep -c '\.minnctapersm 1')
  echo "ptx ws 64x128: $n .minnctapersm 1"; [ "$n" -eq 1 ] || { fail=1; echo "FAILED: ptx ws 64x128"; }
  n=$(ptx | grep -c 'foxc_attn_fwd_ws_')
  echo "ptx default D=64: $n ws lines"; [ "$n" -eq 0 ] || { fail=1; echo "FAILED: ptx default"; }
fi

stamp "(a) correctness of the ws kernel at D = 64: --backend cuda --check $WS"
if [ "${CHECK:-1}" = 1 ]; then
  for tl in 64x64 64x128; do
    sizes="B=1,H=2,T=64,D=64 B=1,H=2,T=130,D=64 B=1,H=3,T=777,D=64 B=1,H=1,T=8291,D=64"
    [ $tl = 64x128 ] && sizes="B=1,H=2,T=130,D=64 B=1,H=1,T=8291,D=64"  # one block per SM, as run 8
    for s in $sizes; do
      for x in "" --no-prune; do
        check_cuda "$F" run fox "$s" $WS --tiles $tl $x || { fail=1; echo "FAILED: check fox $s $tl $x"; }
      done
    done
  done
  for c in "fox_gqa B=1,H=4,G=2,T=1000,D=64" "window B=1,H=4,T=1000,D=64" "fox_softcap B=1,H=4,T=1000,D=64" \
    "fox_keybias B=1,H=4,T=1000,D=64"; do
    set -- $c
    check_cuda "$F" run "$1" "$2" $WS || { fail=1; echo "FAILED: check $1 $2"; }
  done
fi

stamp "(b) standard vs ws, same binary, same inputs (rel L2 < 5e-3; bitwise printed)"
if [ "${CMP:-1}" = 1 ]; then
  for x in "" --no-prune; do
    compare_runs fox B=2,H=8,T=8291,D=64 "$F" "$STD $x" "$F" "$WS $x" --rel-tol 5e-3 ||
      { fail=1; echo "FAILED: compare $x"; }
  done
fi

stamp "(c) compute-sanitizer on the ws D = 64 kernel (264 blocks, 2 per SM)"
if [ "${SAN:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    sanitize "$tool" "$F" B=1,H=66,T=512,D=64 $WS || { fail=1; echo "FAILED: $tool"; }
  done
fi

stamp "(d) timings: foxc bench --iters ${ITERS:=20}, interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=2,H=16,T=16384,D=64 B=1,H=16,T=32768,D=64 B=1,H=2,T=16384,D=64 B=8,H=16,T=4096,D=64"}
  for round in $(seq "${ROUNDS:-2}"); do
    # Round 2 only while the budget lasts (BUDGET seconds since the start, default 170).
    [ "$round" -gt 1 ] && [ $SECONDS -gt "${BUDGET:-170}" ] && { echo "round $round skipped at ${SECONDS}s"; break; }
    variants="std:64x64 ws:64x64 ws:64x128"
    [ "$round" = 1 ] && variants="$variants std:64x128"
    for s in $SHAPES; do
      for v in $variants; do
        k=${v%%:*}; tl=${v#*:}; flags=$STD; [ "$k" = ws ] && flags=$WS
        bench_rows "$k-$tl,r$round" "$F" "$s" $flags --tiles "$tl"
      done
    done
  done | tee "$OUT/d64_ab.csv"
fi

stamp "(e) ncu: registers, occupancy, tensor pipe of the D = 64 kernels at 1x16x32768x64"
if [ "${NCU:-1}" = 1 ]; then
  M=launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
  M=$M,launch__occupancy_limit_warps,sm__warps_active.avg.pct_of_peak_sustained_active
  M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
  for v in ws std; do
    [ $SECONDS -gt "${NCU_BUDGET:-215}" ] && { echo "ncu $v skipped at ${SECONDS}s"; continue; }
    flags=$STD; [ $v = ws ] && flags=$WS
    t 90 ncu --clock-control none --metrics "$M" -k regex:foxc_attn_fwd "$F" run examples/fox.attn \
      --backend cuda --shape B=1,H=16,T=32768,D=64 --seed 0 $flags --tiles 64x64 >"$OUT/ncu_$v.txt" 2>&1
    echo "ncu $v rc=$?"
    grep -E '^\s+foxc_attn_fwd|launch__|sm__|gpu__time' "$OUT/ncu_$v.txt" | awk '{print "  " $1, $(NF)}'
  done
fi

stamp "done after ${SECONDS}s"
if [ $fail = 0 ]; then echo "d64: all checks passed"; else echo "d64: FAILURES"; exit 1; fi
