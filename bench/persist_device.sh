#!/usr/bin/env bash
# Issue 11 item 1 (h10-persist, run 14): the persistent grid of the warp-specialized forward
# (`--ws-grid persistent`) against the tiles grid (`--ws-grid tiles`), ONE binary.
# Binary (built here, stripped, gzipped; carry its folder): FOXC_NEW (default .devbin/h10/foxc.gz).
# Run from the repository root (it sources bench/device_lib.sh); budget <= 3 min (round 2 of the
# timings only while under 110 s).
# Steps, every command under `timeout`, everything into ONE log ($OUT/persist.log):
#   (0) the persistent kernel is the one compiled (`_persist` entry, atom.add on the counter);
#   (a) `foxc run --backend cuda --check --ws-grid persistent`: fox at D = 128, T = 130, 777
#       (and --no-prune), 8291, 1x24x777 (168 items on 132 SMs: blocks take several; also with
#       the cp.async producer, and at D = 64 with --attn-kernel warp-specialized: two blocks per
#       SM); window, fox_keybias (score-hook captures before the new parameters);
#   (b) persistent vs tiles on the same inputs: every output bitwise equal (same arithmetic per
#       item; fox 2x16x4099 pruned: 1056 items, 8 per block; fox_gqa; fox --no-prune);
#   (c) compute-sanitizer memcheck and racecheck, persistent, 1x72x256x128 (144 items);
#   (d) `foxc bench --iters ITERS` (20) pruned and dense rows, tiles and persistent interleaved,
#       ROUNDS (2) rounds at SHAPES (the four standard shapes and 1x1x16384, D = 128);
#   (e) NCU=1 only: ncu L2 hit rate and DRAM bytes of the attention kernel, both grids, 1x16x32768.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; NCU=1; ROUNDS, SHAPES, ITERS,
# ROUND2_BEFORE (seconds).
# Prints "persist: all checks passed" or "persist: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash .devbin/h10/persist_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/persist.log") 2>&1
source bench/device_lib.sh  # unpack, t, check_cuda, compare_runs, sanitize, bench_rows
F=$(unpack "${FOXC_NEW:-.devbin/h10/foxc.gz}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
P="--ws-grid persistent"

echo "## (0) the persistent kernel is the one compiled"
if [ "${PTX:-1}" = 1 ]; then
  for g in persistent tiles; do
    ptx=$(t 60 "$F" compile examples/fox.attn --target sm_90a --shape D=128 --emit ptx --ws-grid $g)
    n=$(grep -c '_persist_' <<<"$ptx"); a=$(grep -c 'atom.global.add\|atom.add' <<<"$ptx")
    echo "ptx --ws-grid $g: $n lines naming _persist_, $a atom.add"
    { [ $g = persistent ] && [ "$n" -gt 0 ] && [ "$a" -gt 0 ]; } || { [ $g = tiles ] && [ "$n" -eq 0 ]; } ||
      { fail=1; echo "FAILED: ptx $g"; }
  done
fi

echo "## (a) correctness, persistent grid: --backend cuda --check $P"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=130,D=128 -" "fox B=1,H=3,T=777,D=128 -" "fox B=1,H=3,T=777,D=128 --no-prune" \
    "fox B=1,H=1,T=8291,D=128 -" "fox B=1,H=24,T=777,D=128 -" "fox B=1,H=24,T=777,D=128 --ws-loads=cp-async" \
    "fox B=1,H=24,T=777,D=64 --attn-kernel=warp-specialized" "window B=1,H=4,T=1000,D=128 -" \
    "fox_keybias B=1,H=4,T=1000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    check_cuda "$F" run "$1" "$2" $P $x || { fail=1; echo "FAILED: check $1 $2 $x"; }
  done
fi

echo "## (b) persistent vs tiles, same binary, same inputs: bitwise equal outputs"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=2,H=16,T=4099,D=128 -" "fox B=1,H=2,T=8291,D=128 --no-prune" \
    "fox_gqa B=2,H=8,G=2,T=2000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    compare_runs "$1" "$2" "$F" "$x --ws-grid tiles" "$F" "$x $P" || { fail=1; echo "FAILED: compare $1 $2 $x"; }
  done
fi

echo "## (c) compute-sanitizer, persistent grid (1x72x256x128: 144 items on 132 blocks)"
if [ "${SAN:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    sanitize $tool "$F" B=1,H=72,T=256,D=128 $P || { fail=1; echo "FAILED: $tool"; }
  done
fi

echo "## (d) timings: foxc bench --iters ${ITERS:=20}, tiles and persistent interleaved (grid,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128 B=1,H=1,T=16384,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    [ "$round" -gt 1 ] && [ "$SECONDS" -gt "${ROUND2_BEFORE:-110}" ] && { echo "round $round skipped (${SECONDS}s)"; break; }
    for s in $SHAPES; do
      for g in tiles persistent; do
        bench_rows "$g,r$round" "$F" "$s" --ws-grid $g
      done
    done
  done | tee "$OUT/persist_ab.csv"
fi

echo "## (e) ncu: L2 hit rate and DRAM bytes of the attention kernel (NCU=1)"
if [ "${NCU:-0}" = 1 ]; then
  for g in tiles persistent; do
    echo "-- $g"
    t 150 ncu --clock-control none -k regex:foxc_attn_fwd \
      --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
      "$F" run examples/fox.attn --backend cuda --shape B=1,H=16,T=32768,D=128 --seed 0 --ws-grid $g 2>&1 |
      grep -E "gpu__time|lts__t_sector_hit|dram__bytes"
  done
fi
echo "persist: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
