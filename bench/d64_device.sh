#!/usr/bin/env bash
# Issue 11 item 2, session 6 (h11-turns, GPU_KERNEL.md run 15): the warp-specialized (ws) forward
# with free-running consumers (`--ws-turns none`: no pingpong ring of turn barriers, each
# consumer issues its GEMMs when its operands are ready) against the ring (`--ws-turns ring`,
# the default) and the standard kernel, ONE binary. (Run 13's calls A / B measured the
# three-consumer block and the two-blocks build with this script's earlier versions.)
# Binary: FOXC_NEW (or FOXC; default .devbin/h11/foxc.gz). Budget: ~4 min with NCU=1.
# Steps, every command under `timeout`, the summary in ONE log ($OUT/d64.log), the bench rows in
# $OUT/d64_ab.csv, everything else (sanitizer logs, ncu pages) in $OUT/d64_aux.tgz:
#   (0) the PTX is the one meant: ws `none` has the `_free_` kernel and no `bar.arrive` (no turn
#       hand-over) at D = 64 and 128, ws `ring` has them; the default at D = 64 is the standard
#       kernel with 128-key tiles;
#   (a) `run --backend cuda --check` of `none`: fox at D = 64 T = 130, 777, 8291 (64x64) and
#       D = 128 T = 777, 8291 (default tiles), pruned and --no-prune; fox at D = 64 64x128 T = 8291;
#       D = 128 with the persistent grid at T = 777 (the grid takes free-running consumers);
#   (b) ring vs none on the same inputs (rel L2 < 5e-3 required, bitwise printed): fox
#       2x8x8291x64 64x64 and 2x8x8291x128, pruned and --no-prune; persistent none vs tiles ring
#       at 2x8x4099x128;
#   (c) compute-sanitizer memcheck and racecheck of `none` at 1x66x512x64 (64x64, three
#       consumers) and 1x72x256x128 (two consumers);
#   (d) `foxc bench --iters 20` (pruned and dense rows), interleaved per shape: at D = 64
#       (SHAPES64, ROUNDS rounds) std 64x128 (the default), ws 64x64 ring, ws 64x64 none, ws
#       64x128 none; at D = 128 (SHAPES128, ROUNDS128 rounds) ws ring (the default) and ws none;
#   (e) NCU=1: ncu of std 64x128, ws 64x64 ring, ws 64x64 none at 1x16x32768x64: registers,
#       achieved occupancy, tensor pipe, issue slots busy, no-eligible, top stall reasons.
# A check that times out (a hang) drops `none` from the later steps.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; NCU=1; ROUNDS (2), ROUNDS128 (1),
# SHAPES64, SHAPES128, ITERS (20).
# Prints "d64: all checks passed" or "d64: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT NCU=1 bash bench/d64_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
X="$OUT/x"; mkdir -p "$X"  # packed into d64_aux.tgz at the end (few files come back)
exec > >(tee "$OUT/d64.log") 2>&1
source bench/device_lib.sh  # unpack, t, check_cuda, compare_runs, sanitize, bench_rows
F=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h11/foxc.gz}}")
WS="--attn-kernel warp-specialized"
STD="--attn-kernel standard"
RING="--ws-turns ring"
NONE="--ws-turns none"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
hung=""
stamp() { echo "## $(date -u +%T) (${SECONDS}s) $*"; }
pack() { tar czf "$OUT/d64_aux.tgz" -C "$X" . && rm -rf "$X"; }

stamp "(0) the PTX of each variant"
if [ "${PTX:-1}" = 1 ]; then
  want() {  # want LABEL COUNT REGEX D FLAGS...: COUNT lines of the PTX match (-1: no PTX)
    local label=$1 n=$2 re=$3 d=$4 got ptx; shift 4
    ptx=$(t 60 "$F" compile examples/fox.attn --target sm_90a --shape "D=$d" --emit ptx "$@") && got=$(grep -cE "$re" <<<"$ptx")
    [ -n "${got:-}" ] || got=-1
    echo "ptx $label: $got of $n lines /$re/"
    [ "$got" -eq "$n" ] || { fail=1; echo "FAILED: ptx $label"; }
  }
  want "ws none D=64: the free kernel" 1 '^\.visible \.entry foxc_attn_fwd_ws_tma_free_d64_' 64 $WS $NONE --tiles 64x64
  want "ws none D=64: no hand-over" 0 'bar\.arrive' 64 $WS $NONE --tiles 64x64
  want "ws none D=128: the free kernel" 1 '^\.visible \.entry foxc_attn_fwd_ws_tma_free_d128_' 128 $NONE
  want "ws none D=128: no hand-over" 0 'bar\.arrive' 128 $NONE
  want "ws ring D=64: the ring's first hand-over" 1 'bar\.arrive[[:space:]]+4, 256;' 64 $WS $RING --tiles 64x64
  want "ws ring D=128 (default): no free kernel" 0 'foxc_attn_fwd_ws_tma_free_' 128
  want "default D=64: std bn128" 1 '^\.visible \.entry foxc_attn_fwd_d64_bm64_bn128_' 64
fi

stamp "(a) correctness of free-running consumers: --backend cuda --check $NONE"
if [ "${CHECK:-1}" = 1 ]; then
  for c in fox:B=1,H=2,T=130,D=64:64x64:- fox:B=1,H=2,T=130,D=64:64x64:--no-prune \
    fox:B=1,H=3,T=777,D=64:64x64:- fox:B=1,H=3,T=777,D=64:64x64:--no-prune \
    fox:B=1,H=1,T=8291,D=64:64x64:- fox:B=1,H=1,T=8291,D=64:64x64:--no-prune \
    fox:B=1,H=1,T=8291,D=64:64x128:- \
    fox:B=1,H=3,T=777,D=128:64x128:- fox:B=1,H=3,T=777,D=128:64x128:--no-prune \
    fox:B=1,H=1,T=8291,D=128:64x128:- fox:B=1,H=1,T=8291,D=128:64x128:--no-prune \
    fox:B=1,H=24,T=777,D=128:64x128:--ws-grid=persistent; do  # (clap takes --flag=value)
    IFS=: read -r p s tl x <<<"$c"; [ "$x" = - ] && x=""
    check_cuda "$F" run "$p" "$s" $WS $NONE --tiles "$tl" $x
    rc=$?
    [ $rc -eq 0 ] && continue
    fail=1; echo "FAILED: check $p $s $tl $x"
    if [ $rc -eq 124 ]; then hung=1; echo "the free-running kernel timed out: its later steps are skipped"; break; fi
  done
fi

stamp "(b) ring vs none, same binary, same inputs (rel L2 < 5e-3; bitwise printed)"
if [ "${CMP:-1}" = 1 ] && [ -z "$hung" ]; then
  for x in "" --no-prune; do
    compare_runs fox B=2,H=8,T=8291,D=64 "$F" "$WS $RING --tiles 64x64 $x" "$F" "$WS $NONE --tiles 64x64 $x" \
      --rel-tol 5e-3 || { fail=1; echo "FAILED: compare D=64 $x"; }
    compare_runs fox B=2,H=8,T=8291,D=128 "$F" "$RING $x" "$F" "$NONE $x" --rel-tol 5e-3 ||
      { fail=1; echo "FAILED: compare D=128 $x"; }
  done
  compare_runs fox B=2,H=16,T=4099,D=128 "$F" "$RING" "$F" "$NONE --ws-grid persistent" --rel-tol 5e-3 ||
    { fail=1; echo "FAILED: compare D=128 persistent none"; }
fi

stamp "(c) compute-sanitizer on free-running consumers at 1x66x512x64 and 1x72x256x128"
if [ "${SAN:-1}" = 1 ] && [ -z "$hung" ]; then
  OUT_SAVED=$OUT; OUT=$X  # the logs go into the aux archive
  for tool in memcheck racecheck; do
    sanitize "$tool" "$F" B=1,H=66,T=512,D=64 $WS $NONE --tiles 64x64 || { fail=1; echo "FAILED: $tool D=64"; }
    sanitize "$tool" "$F" B=1,H=72,T=256,D=128 $NONE || { fail=1; echo "FAILED: $tool D=128"; }
  done
  OUT=$OUT_SAVED
fi

stamp "(d) timings: foxc bench --iters ${ITERS:=20}, interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES64=${SHAPES64:-"B=2,H=16,T=16384,D=64 B=1,H=16,T=32768,D=64"}
  SHAPES128=${SHAPES128:-"B=1,H=16,T=32768,D=128 B=2,H=16,T=16384,D=128"}
  {
    for round in $(seq "${ROUNDS:-2}"); do
      for s in $SHAPES64; do
        for tag in std-64x128 ws-ring-64x64 ws-none-64x64 ws-none-64x128; do
          case "$tag" in
            std-64x128) flags="$STD" tl=64x128 ;;
            ws-ring-64x64) flags="$WS $RING" tl=64x64 ;;
            ws-none-64x64) flags="$WS $NONE" tl=64x64 ;;
            ws-none-64x128) flags="$WS $NONE" tl=64x128 ;;
          esac
          [ -n "$hung" ] && [[ $tag == ws-none* ]] && continue
          bench_rows "$tag,r$round" "$F" "$s" $flags --tiles "$tl"
        done
      done
    done
    for round in $(seq "${ROUNDS128:-1}"); do
      for s in $SHAPES128; do
        bench_rows "ws-ring,r$round" "$F" "$s" $RING
        [ -z "$hung" ] && bench_rows "ws-none,r$round" "$F" "$s" $NONE
      done
    done
  } | tee "$OUT/d64_ab.csv"
fi

stamp "(e) ncu (NCU=1): std 64x128, ws 64x64 ring, ws 64x64 none at 1x16x32768x64"
if [ "${NCU:-0}" = 1 ] && [ -z "$hung" ]; then
  for v in std-64x128 ws-ring-64x64 ws-none-64x64; do
    case "$v" in
      std-64x128) flags="$STD --tiles 64x128" ;;
      ws-ring-64x64) flags="$WS $RING --tiles 64x64" ;;
      ws-none-64x64) flags="$WS $NONE --tiles 64x64" ;;
    esac
    # One launch of the attention, the sections of run 12b's ncu; the pages read from the report.
    t 90 ncu --clock-control none -k regex:foxc_attn_fwd --launch-count 1 \
      --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section SchedulerStats --section SpeedOfLight \
      --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
      -o "$X/ncu_$v" "$F" run examples/fox.attn --backend cuda --shape B=1,H=16,T=32768,D=64 --seed 0 $flags \
      >"$X/ncu_${v}_run.txt" 2>&1
    echo "ncu $v rc=$?"
    t 60 ncu -i "$X/ncu_$v.ncu-rep" --page details >"$X/ncu_$v.txt" 2>&1
    t 60 ncu -i "$X/ncu_$v.ncu-rep" --page raw >"$X/ncu_${v}_raw.txt" 2>&1
    grep -E "Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Duration|Compute \(SM\) Throughput|Executed Ipc Active|Block Size|Dynamic Shared Memory Per" \
      "$X/ncu_$v.txt" | sed 's/^ */  /'
    grep -oE "[A-Za-z]+ is the highest-utilized pipeline \([0-9.]+%\)|highest utilized pipeline \([0-9.]+%\) is [A-Za-z]+" \
      "$X/ncu_$v.txt" | sed 's/^/  /'
    grep -E "gmma|tensor_op|pipe_tensor" "$X/ncu_${v}_raw.txt" | awk '{print "  " $1, $(NF)}' | head -8
    echo "  top stall reasons (warps stalled per issued instruction):"
    grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio" "$X/ncu_${v}_raw.txt" |
      awk '{print $NF, $1}' | sort -gr | head -7 | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/^/    /'
  done
fi

stamp "done"
pack
if [ $fail = 0 ]; then echo "d64: all checks passed"; else echo "d64: FAILURES"; exit 1; fi
