#!/usr/bin/env bash
# Issue 11 item 3 (docs/history/GPU_KERNEL-runs-2026-12.md runs 16, 17): the threshold as one kernel (norms, then each
# head's last block evaluates its deltas; per-head arrival counters left zero) for formulas
# without row statistics, and norms kernels that cover a tile in one step, against the build
# before (OLD: two kernels, norms then delta). Pruned against --no-prune where little or nothing
# is pruned is the measure: the threshold runs beside the gate scan, and must not outlast it.
# Run 17 (`prelude = joint`): the gate scan is one more block per head of the one-kernel
# threshold; the extra checks cover its segments (T = 8192, 8193, 24577), LogGate gates and a
# static bound (qknorm: no joint prelude). The scan's blocks group the compensated sums
# differently from the scan kernel's: compare with CMP_TOL=1e-6 (relative L2) against a build
# before run 17.
# Binaries: NEW, OLD (.gz or plain), BROKEN (optional: NEW without the counter's reset, to show
# that the checks catch a kernel that leaves its counter behind).
# Steps, every command under `timeout`, everything into one log ($OUT/threshold.log):
#   (a) checks of NEW: `run --check` (the plan runs twice, re-poisoned between: the second run's
#       outputs are checked) and `--check-starts` (the in-kernel starts against the reference's:
#       wrong deltas show here even when the output stays within tolerance) for fox with the
#       paper rule (one kernel), local (one kernel, the k_causal scan over several rounds of
#       tiles at T = 20000, D = 64), tight (two kernels, per-row), fox_gqa, at tile counts that
#       are and are not multiples, D = 96 (element loads: no 16-byte layout) and 256 (32 lanes a
#       row); `grad --check` (the backward plan's threshold);
#   (b) NEW against OLD on the same inputs: bitwise (the deltas are the same maxima);
#   (c) compute-sanitizer memcheck, racecheck, synccheck of NEW at 1x66x512x128 (local rule);
#   (d) BROKEN must fail (a) for the paper rule at BROKEN_SHAPE (1x2x4099x64) with --check-starts;
#   (e) timings: `foxc bench` (graph submission), pruned and dense rows, NEW and OLD
#       interleaved, ROUNDS rounds, at SMALL (200 runs) and the standard shapes (20 runs);
#       SERIAL=1: also NEW with FOXC_SERIAL_LAUNCHES=1 at SMALL (one chain, no fork and join);
#   (f) ncu kernel durations of every kernel, pruned and --no-prune, NEW and OLD, at NCU_SHAPES
#       (default 1x1x2048x128, 1x1x4096x64, 1x16x32768x128).
# Knobs: CHECK=0 / CMP=0 / SAN=0 / TIME=0 / NCU=0 skip a step; ROUNDS, SMALL, SHAPES, NCU_SHAPES.
# Prints "threshold: all checks passed" or "threshold: FAILURES" last.
# Usage (GPU machine, repository root): NEW=... OLD=... [BROKEN=...] OUT=$OUT bash bench/threshold_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
log_to threshold.log
NEW=$(unpack "${NEW:?set NEW to the new foxc binary}")
OLD=$(unpack "${OLD:?set OLD to the previous foxc binary}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
stamp() { echo "## $(date -u +%T) (${SECONDS}s) $*"; }

stamp "(a) checks of NEW"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=4099,D=64" "fox B=1,H=1,T=2048,D=128" "fox B=2,H=3,T=777,D=128" \
    "fox B=1,H=1,T=16384,D=128" "fox_gqa B=1,H=4,G=2,T=1000,D=128" "fox_alibi B=1,H=2,T=1000,D=64" \
    "fox B=1,H=2,T=1000,D=96" "fox B=1,H=2,T=1000,D=256" "fox B=1,H=1,T=8192,D=128" \
    "fox B=2,H=2,T=8193,D=64" "fox B=1,H=1,T=24577,D=64" "fox_loggate B=1,H=2,T=9000,D=64" \
    "fox_qknorm B=1,H=2,T=3000,D=64" "fox B=1,H=3,T=4096,D=64" "fox B=2,H=1,T=4097,D=128"; do
    # shellcheck disable=SC2086
    check_cuda "$NEW" run $c --check-starts || fail=1
  done
  for r in local tight; do
    check_cuda "$NEW" run fox B=1,H=2,T=20000,D=64 --prune-rule "$r" --check-starts || fail=1
    check_cuda "$NEW" run fox B=1,H=3,T=777,D=128 --prune-rule "$r" --check-starts || fail=1
  done
  check_cuda "$NEW" run fox B=1,H=1,T=4099,D=64 --no-prune || fail=1
  check_cuda "$NEW" grad fox B=1,H=2,T=777,D=128 || fail=1
  check_cuda "$NEW" grad fox B=1,H=2,T=1000,D=64 --prune-rule local || fail=1
  check_cuda "$NEW" grad fox B=1,H=2,T=9000,D=64 || fail=1
fi

stamp "(b) NEW against OLD, same inputs, bitwise"
if [ "${CMP:-1}" = 1 ]; then
  tol=(${CMP_TOL:+--rel-tol "$CMP_TOL"})
  compare_runs fox B=1,H=1,T=16384,D=128 "$OLD" "" "$NEW" "" "${tol[@]}" || fail=1
  compare_runs fox B=2,H=8,T=8291,D=64 "$OLD" "" "$NEW" "" "${tol[@]}" || fail=1
  compare_runs fox B=1,H=2,T=20000,D=64 "$OLD" "--prune-rule local" "$NEW" "--prune-rule local" "${tol[@]}" || fail=1
  compare_runs fox B=1,H=4,T=3000,D=128 "$OLD" "--prune-rule tight" "$NEW" "--prune-rule tight" "${tol[@]}" || fail=1
  compare_runs fox B=1,H=16,T=32768,D=128 "$OLD" "" "$NEW" "" "${tol[@]}" || fail=1
fi

stamp "(c) compute-sanitizer on NEW"
if [ "${SAN:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    sanitize "$tool" "$NEW" B=1,H=66,T=512,D=128 --prune-rule local || fail=1
    sanitize "$tool" "$NEW" B=1,H=2,T=9000,D=64 || fail=1
  done
fi

stamp "(d) BROKEN (no counter reset) must fail"
if [ -n "${BROKEN:-}" ]; then
  BR=$(unpack "$BROKEN")
  bs=${BROKEN_SHAPE:-B=1,H=2,T=4099,D=64}
  if check_cuda "$BR" run fox "$bs" --check-starts; then
    echo "FAILED: the broken build passed the checks"; fail=1
  else
    echo "ok: the broken build fails the checks"
  fi
  check_cuda "$BR" run fox "$bs" || true
fi

stamp "(e) timings: foxc bench, graph submission (tag,binary,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SMALL=${SMALL:-"B=1,H=1,T=2048,D=128 B=1,H=1,T=4096,D=128 B=1,H=1,T=4096,D=64 B=1,H=1,T=2048,D=64 B=1,H=1,T=8192,D=128 B=1,H=1,T=16384,D=128 B=1,H=2,T=16384,D=64"}
  SHAPES=${SHAPES-"B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128 B=1,H=16,T=32768,D=64"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SMALL; do
      for b in old new; do
        bin=$NEW; [ $b = old ] && bin=$OLD
        ITERS=${ITERS_SMALL:-200} bench_rows "small,$b,r$round" "$bin" "$s"
      done
    done
  done | tee "$OUT/threshold_small.csv"
  if [ "${SERIAL:-0}" = 1 ]; then
    # The threshold and the scan in one chain: what the fork and join of the two lanes cost.
    for s in $SMALL; do
      FOXC_SERIAL_LAUNCHES=1 ITERS=${ITERS_SMALL:-200} bench_rows "small,new-serial,r1" "$NEW" "$s"
    done | tee "$OUT/threshold_serial.csv"
  fi
  for s in $SHAPES; do
    for b in old new; do
      bin=$NEW; [ $b = old ] && bin=$OLD
      ITERS=${ITERS:-20} bench_rows "std,$b,r1" "$bin" "$s"
    done
  done | tee "$OUT/threshold_std.csv"
fi

stamp "(f) ncu kernel durations (the new build runs the plan twice: two lines per kernel)"
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  for s in ${NCU_SHAPES:-B=1,H=1,T=2048,D=128 B=1,H=1,T=4096,D=64 B=1,H=16,T=32768,D=128}; do
    for b in old new; do
      bin=$NEW; [ $b = old ] && bin=$OLD
      for np in "" --no-prune; do
        echo "# $b $s ${np:-pruned}"
        # shellcheck disable=SC2086
        kernel_durations "$bin" "$s" . $np
      done
    done
  done
fi
stamp done
[ $fail = 0 ] && echo "threshold: all checks passed" || { echo "threshold: FAILURES"; exit 1; }
