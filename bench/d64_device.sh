#!/usr/bin/env bash
# Issue 11 item 2 (h9-d64, GPU_KERNEL.md run 13, call B): the warp-specialized (ws) forward at
# D = 64 as one block of three consumer warpgroups per SM (192 rows, 512 threads, setmaxnreg
# 32 / 160) against the standard kernel, ONE binary: `--attn-kernel standard|warp-specialized`
# (the tiles pass's own choice at D = 64 is the standard kernel with 64x128 tiles since call A).
# (Call A measured the earlier two-blocks-per-SM build with this script's previous version.)
# Binary: FOXC_NEW (or FOXC; default .devbin/h9b/foxc.gz). Budget: ~2 min.
# Steps, every command under `timeout`, everything into ONE log ($OUT/d64.log):
#   (0) the PTX is the one meant: ws 64x64 `.maxntid 512` and `setmaxnreg.inc 160`; without the
#       flag no `_ws_` kernel and the standard kernel with 128-key tiles (`_bn128_`);
#   (a) `run --backend cuda --check`, ws forced: fox at T = 64, 130, 777, 8291 (64x64; --no-prune
#       at 8291), 64x128 at 8291; fox_gqa, window, fox_softcap, fox_keybias at T = 1000 (64x64);
#   (b) standard vs ws on the same inputs, fox 2x8x8291x64 64x64, pruned and --no-prune: rel L2
#       < 5e-3 required, bitwise printed (call A: bitwise equal);
#   (c) compute-sanitizer memcheck and racecheck of the ws kernel at 1x66x512x64;
#   (d) `foxc bench --iters 20` (pruned and dense rows), one round, std 64x128 (the default), ws
#       64x64, ws 64x128, interleaved per shape, at SHAPES (2x16x16384x64, 1x16x32768x64);
#   (e) NCU=1 only: ncu registers / occupancy / tensor pipe of ws and std at 1x16x32768x64.
# A check that times out (a hang) drops the ws kernel from the later steps.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; NCU=1; ROUNDS, SHAPES, ITERS.
# Prints "d64: all checks passed" or "d64: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/d64_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/d64.log") 2>&1
source bench/device_lib.sh  # unpack, t, check_cuda, compare_runs, sanitize, bench_rows
F=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h9b/foxc.gz}}")
WS="--attn-kernel warp-specialized"
STD="--attn-kernel standard"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
hung=""
stamp() { echo "## $(date -u +%T) (${SECONDS}s) $*"; }

stamp "(0) the PTX of each variant"
if [ "${PTX:-1}" = 1 ]; then
  want() {  # want LABEL COUNT REGEX FLAGS...
    local label=$1 n=$2 re=$3 got; shift 3
    got=$(t 60 "$F" compile examples/fox.attn --target sm_90a --shape D=64 --emit ptx "$@" | grep -cE "$re")
    echo "ptx $label: $got of $n lines /$re/"
    [ "$got" -eq "$n" ] || { fail=1; echo "FAILED: ptx $label"; }
  }
  want "ws 64x64" 2 '\.maxntid 512|setmaxnreg\.inc\.sync\.aligned\.u32[[:space:]]+160;' $WS --tiles 64x64
  want "default: no ws" 0 'foxc_attn_fwd_ws_'
  want "default: std bn128" 1 '^\.visible \.entry foxc_attn_fwd_d64_bm64_bn128_'
fi

stamp "(a) correctness of the ws kernel at D = 64: --backend cuda --check $WS"
if [ "${CHECK:-1}" = 1 ]; then
  for c in fox:B=1,H=2,T=64,D=64:64x64:- fox:B=1,H=2,T=130,D=64:64x64:- fox:B=1,H=3,T=777,D=64:64x64:- \
    fox:B=1,H=1,T=8291,D=64:64x64:- fox:B=1,H=1,T=8291,D=64:64x64:--no-prune fox:B=1,H=1,T=8291,D=64:64x128:- \
    fox_gqa:B=1,H=4,G=2,T=1000,D=64:64x64:- window:B=1,H=4,T=1000,D=64:64x64:- \
    fox_softcap:B=1,H=4,T=1000,D=64:64x64:- fox_keybias:B=1,H=4,T=1000,D=64:64x64:-; do
    IFS=: read -r p s tl x <<<"$c"; [ "$x" = - ] && x=""
    check_cuda "$F" run "$p" "$s" $WS --tiles "$tl" $x
    rc=$?
    [ $rc -eq 0 ] && continue
    fail=1; echo "FAILED: check $p $s $tl $x"
    if [ $rc -eq 124 ]; then hung=1; echo "the ws kernel timed out: its later steps are skipped"; break; fi
  done
fi

stamp "(b) standard vs ws, same binary, same inputs (rel L2 < 5e-3; bitwise printed)"
if [ "${CMP:-1}" = 1 ] && [ -z "$hung" ]; then
  for x in "" --no-prune; do
    compare_runs fox B=2,H=8,T=8291,D=64 "$F" "$STD --tiles 64x64 $x" "$F" "$WS --tiles 64x64 $x" --rel-tol 5e-3 ||
      { fail=1; echo "FAILED: compare $x"; }
  done
fi

stamp "(c) compute-sanitizer on the ws D = 64 kernel at 1x66x512x64"
if [ "${SAN:-1}" = 1 ] && [ -z "$hung" ]; then
  for tool in memcheck racecheck; do
    sanitize "$tool" "$F" B=1,H=66,T=512,D=64 $WS --tiles 64x64 || { fail=1; echo "FAILED: $tool"; }
  done
fi

stamp "(d) timings: foxc bench --iters ${ITERS:=20}, interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=2,H=16,T=16384,D=64 B=1,H=16,T=32768,D=64"}
  variants="std:64x128"; [ -z "$hung" ] && variants="$variants ws:64x64 ws:64x128"
  for round in $(seq "${ROUNDS:-1}"); do
    for s in $SHAPES; do
      for v in $variants; do
        k=${v%%:*}; tl=${v#*:}; flags=$WS; [ "$k" = std ] && flags=$STD
        bench_rows "$k-$tl,r$round" "$F" "$s" $flags --tiles "$tl"
      done
    done
  done | tee "$OUT/d64_ab.csv"
fi

stamp "(e) ncu (NCU=1): registers, occupancy, tensor pipe at 1x16x32768x64"
if [ "${NCU:-0}" = 1 ] && [ -z "$hung" ]; then
  M=launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
  M=$M,launch__occupancy_limit_warps,sm__warps_active.avg.pct_of_peak_sustained_active
  M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
  for v in ws:64x64 std:64x128; do
    k=${v%%:*}; tl=${v#*:}; flags=$WS; [ "$k" = std ] && flags=$STD
    t 60 ncu --clock-control none --metrics "$M" -k regex:foxc_attn_fwd "$F" run examples/fox.attn \
      --backend cuda --shape B=1,H=16,T=32768,D=64 --seed 0 $flags --tiles "$tl" >"$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$?"
    grep -E '^\s+foxc_attn_fwd|launch__|sm__|gpu__time' "$OUT/ncu_$k.txt" | awk '{print "  " $1, $(NF)}'
  done
fi

stamp "done"
if [ $fail = 0 ]; then echo "d64: all checks passed"; else echo "d64: FAILURES"; exit 1; fi
