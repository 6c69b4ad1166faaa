#!/usr/bin/env bash
# Issue 11 item 2 (h9-d64, GPU_KERNEL.md run 13): the warp-specialized (ws) forward at D = 64
# against the standard kernel, selected per run by `--attn-kernel standard|warp-specialized`
# (the tiles pass's own choice at D = 64 is standard). Two builds of the ws kernel at D = 64:
#   A (FOXC_NEW, default .devbin/h9/foxc.gz, main): two blocks of two consumers per SM with
#     64-key tiles (`.minnctapersm 2`, setmaxnreg 24 / 104); one block per SM with 128-key tiles;
#   B (FOXC_B, default .devbin/h9b/foxc.gz, branch h9-three): one block of three consumers per
#     SM (192 rows, 512 threads, setmaxnreg 32 / 160). Skipped when the file is missing.
# The standard kernel and D = 128 are the same in both (PTX byte-identical).
# Steps, every command under `timeout`, everything into ONE log ($OUT/d64.log); budget ~4 min:
#   (0) the PTX is the one meant (A 64x64: `.minnctapersm 2`, `setmaxnreg.inc 104`; A 64x128:
#       `.minnctapersm 1`; B: `.maxntid 512`, `setmaxnreg.inc 160`; no flag: no `_ws_` kernel);
#   (a) `run --backend cuda --check` with the ws kernel forced: B: fox at T = 64, 130, 777, 8291
#       (pruned; --no-prune at 777, 8291), 64x128 at 130 and 8291, fox_gqa, window, fox_softcap,
#       fox_keybias at T = 1000; A: fox at 130, 777, 8291 (+ --no-prune at 8291), 64x128 at 8291,
#       fox_softcap and fox_keybias at 1000;
#   (b) standard vs ws on the same inputs, fox 2x8x8291x64 pruned and --no-prune (A and B):
#       rel L2 < 5e-3 required, bitwise printed (run 8 found them bitwise equal at D = 128);
#   (c) compute-sanitizer on the ws D = 64 kernel at 1x66x512x64: memcheck A and B, racecheck B
#       (A's protocol is D = 128's, racecheck-clean in runs 8-11; racecheck A only by budget);
#   (d) `foxc bench --iters 20` (pruned and dense rows), interleaved per shape: std 64x64, wsA
#       64x64, wsB 64x64, wsB 64x128 (+ std 64x128, wsA 64x128 in round 1), ROUNDS (2) rounds,
#       round 2 only before BUDGET (170) seconds, at SHAPES;
#   (e) ncu of wsB, wsA and std at 1x16x32768x64 (registers, occupancy limits, achieved warps,
#       tensor pipe), each only before NCU_BUDGET (215) seconds.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 / NCU=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "d64: all checks passed" or "d64: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/d64_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/d64.log") 2>&1
source bench/device_lib.sh  # unpack, t, check_cuda, compare_runs, sanitize, bench_rows
FA=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h9/foxc.gz}}")
FB_SRC=${FOXC_B:-.devbin/h9b/foxc.gz}
FB=""; [ -f "$FB_SRC" ] && FB=$(unpack "$FB_SRC")
WS="--attn-kernel warp-specialized"
STD="--attn-kernel standard"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
stamp() { echo "## $(date -u +%T) (${SECONDS}s) $*"; }
# bin_of A|B: the binary of a build ("" when B is missing).
bin_of() { if [ "$1" = A ]; then [ -z "${FA_HUNG:-}" ] && echo "$FA"; else echo "$FB"; fi; }
builds="A"; [ -n "$FB" ] && builds="B A"
echo "builds: A=$FA B=${FB:-missing}"

stamp "(0) the PTX of each variant"
if [ "${PTX:-1}" = 1 ]; then
  ptx() { local f=$1; shift; t 60 "$f" compile examples/fox.attn --target sm_90a --shape D=64 --emit ptx "$@"; }
  want() {  # want LABEL COUNT REGEX BIN FLAGS...
    local label=$1 n=$2 re=$3 f=$4 got; shift 4
    got=$(ptx "$f" "$@" | grep -cE "$re")
    echo "ptx $label: $got of $n lines /$re/"
    [ "$got" -eq "$n" ] || { fail=1; echo "FAILED: ptx $label"; }
  }
  want "A ws 64x64" 2 '\.minnctapersm 2|setmaxnreg\.inc\.sync\.aligned\.u32[[:space:]]+104;' "$FA" $WS --tiles 64x64
  want "A ws 64x128" 1 '\.minnctapersm 1' "$FA" $WS --tiles 64x128
  want "A default" 0 'foxc_attn_fwd_ws_' "$FA"
  if [ -n "$FB" ]; then
    want "B ws 64x64" 2 '\.maxntid 512|setmaxnreg\.inc\.sync\.aligned\.u32[[:space:]]+160;' "$FB" $WS --tiles 64x64
    want "B default" 0 'foxc_attn_fwd_ws_' "$FB"
  fi
fi

stamp "(a) correctness of the ws kernel at D = 64: --backend cuda --check $WS"
if [ "${CHECK:-1}" = 1 ]; then
  for bld in $builds; do
    f=$(bin_of $bld)
    if [ $bld = B ]; then
      cases="64x64:B=1,H=2,T=64,D=64:- 64x64:B=1,H=2,T=130,D=64:- 64x64:B=1,H=3,T=777,D=64:- \
        64x64:B=1,H=3,T=777,D=64:--no-prune 64x64:B=1,H=1,T=8291,D=64:- 64x64:B=1,H=1,T=8291,D=64:--no-prune \
        64x128:B=1,H=2,T=130,D=64:- 64x128:B=1,H=1,T=8291,D=64:-"
      variants="fox_gqa:B=1,H=4,G=2,T=1000,D=64 window:B=1,H=4,T=1000,D=64 fox_softcap:B=1,H=4,T=1000,D=64 \
        fox_keybias:B=1,H=4,T=1000,D=64"
    else
      cases="64x64:B=1,H=2,T=130,D=64:- 64x64:B=1,H=3,T=777,D=64:- 64x64:B=1,H=1,T=8291,D=64:- \
        64x64:B=1,H=1,T=8291,D=64:--no-prune 64x128:B=1,H=1,T=8291,D=64:-"
      variants="fox_softcap:B=1,H=4,T=1000,D=64 fox_keybias:B=1,H=4,T=1000,D=64"
    fi
    for c in $cases $variants; do
      [ -n "$(bin_of $bld)" ] || break  # a hung build is dropped
      case "$c" in
        64x*) IFS=: read -r tl s x <<<"$c"; p=fox; [ "$x" = - ] && x=""; args=(--tiles "$tl" $x) ;;
        *) IFS=: read -r p s <<<"$c"; args=() ;;
      esac
      echo -n "[$bld] "
      check_cuda "$f" run "$p" "$s" $WS "${args[@]}"
      rc=$?
      [ $rc -eq 0 ] && continue
      fail=1; echo "FAILED: $bld check $p $s ${args[*]}"
      # A timeout is a hang: the build's other steps would only time out too.
      if [ $rc -eq 124 ]; then
        echo "build $bld timed out: its remaining checks, compares, sanitizers and timings are skipped"
        if [ $bld = B ]; then FB=""; builds=A; else FA_HUNG=1; fi
      fi
    done
  done
fi

stamp "(b) standard vs ws, same binary, same inputs (rel L2 < 5e-3; bitwise printed)"
if [ "${CMP:-1}" = 1 ]; then
  for bld in $builds; do
    f=$(bin_of $bld); [ -n "$f" ] || continue
    for x in "" --no-prune; do
      echo -n "[$bld] "
      compare_runs fox B=2,H=8,T=8291,D=64 "$f" "$STD $x" "$f" "$WS $x" --rel-tol 5e-3 ||
        { fail=1; echo "FAILED: $bld compare $x"; }
    done
  done
fi

stamp "(c) compute-sanitizer on the ws D = 64 kernel at 1x66x512x64"
if [ "${SAN:-1}" = 1 ]; then
  for run in B:memcheck B:racecheck A:memcheck A:racecheck; do
    bld=${run%%:*}; tool=${run#*:}; f=$(bin_of $bld)
    [ -n "$f" ] || continue
    if [ "$run" = A:racecheck ] && [ $SECONDS -gt "${SAN_BUDGET:-100}" ]; then
      echo "racecheck A skipped at ${SECONDS}s"; continue
    fi
    echo -n "[$bld] "
    sanitize "$tool" "$f" B=1,H=66,T=512,D=64 $WS || { fail=1; echo "FAILED: $bld $tool"; }
  done
fi

stamp "(d) timings: foxc bench --iters ${ITERS:=20}, interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=2,H=16,T=16384,D=64 B=1,H=16,T=32768,D=64 B=1,H=2,T=16384,D=64 B=8,H=16,T=4096,D=64"}
  for round in $(seq "${ROUNDS:-2}"); do
    [ "$round" -gt 1 ] && [ $SECONDS -gt "${BUDGET:-170}" ] && { echo "round $round skipped at ${SECONDS}s"; break; }
    variants="std:A:64x64"
    [ -z "${FA_HUNG:-}" ] && variants="$variants wsA:A:64x64"
    [ -n "$FB" ] && variants="$variants wsB:B:64x64 wsB:B:64x128"
    [ "$round" = 1 ] && variants="$variants std:A:64x128"
    [ "$round" = 1 ] && [ -z "${FA_HUNG:-}" ] && variants="$variants wsA:A:64x128"
    for s in $SHAPES; do
      for v in $variants; do
        IFS=: read -r k bld tl <<<"$v"; flags=$WS; [ "$k" = std ] && flags=$STD
        f=$FA; [ $bld = B ] && f=$FB  # std runs on A even when A's ws kernel hung
        bench_rows "$k-$tl,r$round" "$f" "$s" $flags --tiles "$tl"
      done
    done
  done | tee "$OUT/d64_ab.csv"
fi

stamp "(e) ncu: registers, occupancy, tensor pipe of the D = 64 kernels at 1x16x32768x64"
if [ "${NCU:-1}" = 1 ]; then
  M=launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
  M=$M,launch__occupancy_limit_warps,sm__warps_active.avg.pct_of_peak_sustained_active
  M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
  for v in wsB:B wsA:A std:A; do
    k=${v%%:*}; f=$(bin_of "${v#*:}"); [ "$k" = std ] && f=$FA; [ -n "$f" ] || continue
    [ $SECONDS -gt "${NCU_BUDGET:-215}" ] && { echo "ncu $k skipped at ${SECONDS}s"; continue; }
    flags=$WS; [ "$k" = std ] && flags=$STD
    t 60 ncu --clock-control none --metrics "$M" -k regex:foxc_attn_fwd "$f" run examples/fox.attn \
      --backend cuda --shape B=1,H=16,T=32768,D=64 --seed 0 $flags --tiles 64x64 >"$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$?"
    grep -E '^\s+foxc_attn_fwd|launch__|sm__|gpu__time' "$OUT/ncu_$k.txt" | awk '{print "  " $1, $(NF)}'
  done
fi

stamp "done"
if [ $fail = 0 ]; then echo "d64: all checks passed"; else echo "d64: FAILURES"; exit 1; fi
