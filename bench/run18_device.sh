#!/usr/bin/env bash
# Two binaries (NEW, OLD; the same one for a single build) in one call (issue 11 items 2 and 3;
# first used for run 18 of docs/history/GPU_KERNEL-runs-2026-12.md):
#   item 3: the joint prelude's scan sized by T (segments of 4096 up to T = 4096, 8192 above)
#     against OLD (run 17: 8192 always), `foxc bench` pruned and dense rows at one head and the
#     standard shapes, and ncu durations of the threshold kernels;
#   item 2: D = 64 with 128-key tiles on the warp-specialized path, now two consumers of 224
#     registers (three spilled at 160): checks (tiles and persistent grid, pruned and dense),
#     against the standard kernel on the same inputs (bitwise: the same per-row arithmetic),
#     memcheck and racecheck, then `foxc bench` of std 64x128 (the default), ws 64x128 tiles
#     grid and ws 64x128 persistent, interleaved per shape; NCU=1: ncu of std and ws at
#     1x16x32768x64 (registers, occupancy, issue slots, pipes, stalls).
# The joint prelude's own checks and sanitizers: bench/threshold_device.sh (CHECK/CMP/SAN).
# Knobs: D64=0 / JOINT=0 skip a part; STD=0 skips item 3's standard shapes; ROUNDS (1) of its
# one-head shapes (ONE_HEAD: their list, five by default); STD_ROUNDS (1) of the standard
# shapes; NCU=1 (item 2's ncu); NCU_FLAGS (item 3's ncu durations, e.g. "--cache-control none");
# DUR_KERNELS (regex, "threshold|scan") and DUR_SHAPES (four shapes; empty: none) for those
# durations; ITERS (100 one-head, 20 standard).
# Prints "run18: all checks passed" or "run18: FAILURES" last.
# Usage (GPU machine, repository root): NEW=... OLD=... OUT=$OUT bash bench/run18_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh  # unpack, check_cuda, compare_runs, sanitize, bench_rows, bench_table
log_to run18.log
NEW=$(unpack "${NEW:?}"); OLD=$(unpack "${OLD:?}")
WS="--attn-kernel warp-specialized --tiles 64x128"
fail=0
stamp() { echo "## $(date -u +%T) (${SECONDS}s) $*"; }
if [ "${D64:-1}" = 1 ]; then
  stamp "item 2: D = 64, 128-key tiles, two consumers: checks"
  for c in B=1,H=2,T=130,D=64 B=1,H=3,T=777,D=64 B=1,H=1,T=8291,D=64; do
    for x in "" --no-prune --ws-grid=persistent; do
      # shellcheck disable=SC2086
      check_cuda "$NEW" run fox $c $WS $x || fail=1
    done
  done
  check_cuda "$NEW" run fox B=1,H=24,T=777,D=64 $WS --ws-grid=persistent || fail=1
  check_cuda "$NEW" run fox_gqa B=1,H=4,G=2,T=1000,D=64 $WS || fail=1
  check_cuda "$NEW" run fox_softcap B=1,H=2,T=1000,D=64 $WS || fail=1
  compare_runs fox B=2,H=8,T=8291,D=64 "$NEW" "" "$NEW" "$WS" || fail=1
  compare_runs fox B=2,H=8,T=8291,D=64 "$NEW" "--no-prune" "$NEW" "$WS --no-prune" || fail=1
  compare_runs fox B=1,H=20,T=4099,D=64 "$NEW" "" "$NEW" "$WS --ws-grid=persistent" || fail=1
  for tool in memcheck racecheck; do
    sanitize "$tool" "$NEW" B=1,H=66,T=512,D=64 $WS || fail=1
    sanitize "$tool" "$NEW" B=1,H=20,T=700,D=64 $WS --ws-grid=persistent || fail=1
  done
  stamp "item 2: timings (std 64x128 default, ws tiles, ws persistent)"
  for s in B=2,H=16,T=16384,D=64 B=1,H=16,T=32768,D=64 B=4,H=16,T=8192,D=64 B=8,H=16,T=4096,D=64; do
    ITERS=${ITERS:-20} bench_rows std "$NEW" $s
    ITERS=${ITERS:-20} bench_rows ws "$NEW" $s $WS
    ITERS=${ITERS:-20} bench_rows wsp "$NEW" $s $WS --ws-grid persistent
  done > "$OUT/d64.csv"
  bench_table "$OUT/d64.csv" std ws wsp
  if [ "${NCU:-0}" = 1 ]; then
    m=launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum
    for x in "" "$WS"; do
      echo "# ncu ${x:-std}"
      # shellcheck disable=SC2086
      t 150 ncu --clock-control none --metrics $m -k regex:attn_fwd "$NEW" run examples/fox.attn --backend cuda \
        --shape B=1,H=16,T=32768,D=64 $x 2>&1 | grep -E "^\s+foxc_|[a-z_]+__" | head -16
    done
  fi
fi

if [ "${JOINT:-1}" = 1 ]; then
  stamp "item 3: pruned and dense, OLD and NEW interleaved"
  for r in $(seq "${ROUNDS:-1}"); do
    for s in ${ONE_HEAD:-B=1,H=1,T=2048,D=128 B=1,H=1,T=4096,D=64 B=1,H=1,T=4096,D=128 B=1,H=1,T=8192,D=128 B=1,H=1,T=16384,D=128}; do
      for b in old new; do x=$OLD; [ $b = new ] && x=$NEW; ITERS=${ITERS:-100} bench_rows $b$r $x $s; done
    done
  done > "$OUT/joint.csv"
  if [ "${STD:-1}" = 1 ]; then
    for r in $(seq "${STD_ROUNDS:-1}"); do
      for s in B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128; do
        for b in old new; do x=$OLD; [ $b = new ] && x=$NEW; ITERS=${ITERS:-20} bench_rows s$b$r $x $s; done
      done
    done >> "$OUT/joint.csv"
  fi
  for r in $(seq "${ROUNDS:-1}"); do bench_table "$OUT/joint.csv" old$r new$r; done
  for r in $(seq "${STD_ROUNDS:-1}"); do bench_table "$OUT/joint.csv" sold$r snew$r; done
  DUR_KERNELS=${DUR_KERNELS:-threshold|scan}
  for s in ${DUR_SHAPES-B=1,H=1,T=2048,D=128 B=1,H=1,T=4096,D=64 B=1,H=1,T=16384,D=128 B=1,H=16,T=32768,D=128}; do
    for b in old new; do x=$OLD; [ $b = new ] && x=$NEW; echo "# $b $s $(kernel_durations $x $s "$DUR_KERNELS" | tr '\n' ' ')"; done
  done
fi
[ $fail = 0 ] && echo "run18: all checks passed" || echo "run18: FAILURES"
