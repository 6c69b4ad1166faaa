#!/usr/bin/env bash
# Issue 11 item 3 (h7-prelude): the launches before the attention. The new build runs the gate
# scan beside the threshold kernels (two streams, fork/join on the plan's dependencies), the
# scan through shared memory with coalesced loads, the norms kernel with several rows in flight.
# FOXC_SERIAL_LAUNCHES=1 runs the same build's launches in plan order on one stream (the
# concurrency alone: new-serial vs new). Binaries (stripped, gzipped; carry both folders):
# FOXC_BASE (default .devbin/s4/foxc.gz) and FOXC_NEW (default .devbin/h7/foxc.gz: the base's
# commit plus h7's commits only, so the attention kernels are the base's).
# Steps, every command under `timeout`, everything into ONE log ($OUT/prelude.log):
#   (a) --check of the new build: fox (T = 777 / 4099, D = 64 / 128, pruned and --no-prune),
#       fox_alibi (Slope gates), fox_loggate, fox_gqa, fox at T = 9000 (two scan segments),
#       and `foxc grad --backend cuda --check` of fox (its plan forks too);
#   (b) same inputs: new vs base and new vs new-serial outputs (bitwise; the scan's c is
#       round_f32(exact cumsum) in both builds), at T up to 32768 (four scan segments);
#   (c) `foxc bench --iters 50` (pruned and dense rows) base, new, new-serial interleaved,
#       2 rounds, at SHAPES;
#   (d) ncu kernel durations of one new run (pruned, dense) at 1x1x16384x128 and of the
#       prelude kernels at 1x16x32768x128;
#   (e) (run after (b)) compute-sanitizer racecheck and memcheck of the scan at T = 9000,
#       memcheck of every kernel at T = 777.
# Knobs: CHECK=0 / CMP=0 / SAN=0 / TIME=0 / NCU=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "prelude: all checks passed" or "prelude: FAILURES" last; exit 1 on a failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/prelude_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/prelude.log") 2>&1
source bench/device_lib.sh  # unpack, t, compare_outputs
BASE=$(unpack "${FOXC_BASE:-.devbin/s4/foxc.gz}")
NEW=$(unpack "${FOXC_NEW:-.devbin/h7/foxc.gz}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0

echo "## (a) correctness of the new build: --backend cuda --check"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "run fox B=1,H=2,T=777,D=64" "run fox B=1,H=2,T=777,D=128" "run fox B=1,H=1,T=4099,D=64" \
    "run fox B=1,H=1,T=4099,D=128" "run fox B=1,H=1,T=9000,D=64" "run fox_alibi B=1,H=4,T=1000,D=128" \
    "run fox_loggate B=1,H=2,T=1000,D=64" "run fox_gqa B=1,H=4,G=2,T=1000,D=128" \
    "grad fox B=1,H=2,T=777,D=64" "grad fox B=1,H=1,T=1000,D=128"; do
    set -- $c
    extras=("")
    [ "$1 $2" = "run fox" ] && extras=("" "--no-prune")
    for x in "${extras[@]}"; do
      check_cuda "$NEW" "$1" "$2" "$3" $x || { fail=1; echo "FAILED: check $1 $2 $3 $x"; }
    done
  done
fi

echo "## (b) same inputs: new vs base, new vs new-serial (bitwise)"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=32768,D=64 -" "fox B=1,H=1,T=16384,D=128 -" "fox B=1,H=1,T=16384,D=128 --no-prune" \
    "fox_loggate B=1,H=2,T=20000,D=64 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    d=$(mktemp -d)
    t 60 "$BASE" inputs "examples/$1.attn" --shape "$2" --seed 3 -o "$d/in.safetensors" >/dev/null &&
      t 60 "$BASE" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/base.safetensors" >/dev/null &&
      t 60 "$NEW" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/new.safetensors" >/dev/null &&
      FOXC_SERIAL_LAUNCHES=1 t 60 "$NEW" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x \
        -o "$d/serial.safetensors" >/dev/null
    rc=$?
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: runs of $1 $2 $x rc=$rc"; rm -rf "$d"; continue; }
    for pair in "base new" "serial new"; do
      set -- $pair
      # new vs serial: the same kernels, so bitwise. new vs base: bitwise when the two builds
      # differ only in the prelude (the scan rounds to round_f32(exact) in both); another attention
      # kernel may round bf16 outputs differently: rel L2 < 5e-3 (the (a) checks against the f64
      # reference are the correctness gate).
      tol=(); [ "$1" = base ] && tol=(--rel-tol 5e-3)
      compare_outputs "$d/$1.safetensors" "$d/$2.safetensors" "$1 vs $2 [$c]" "${tol[@]}" ||
        { fail=1; echo "FAILED: compare $pair $c"; }
    done
    rm -rf "$d"
  done
fi

echo "## (e) compute-sanitizer: the scan and threshold kernels at T = 9000 (two scan segments)"
if [ "${SAN:-1}" = 1 ]; then
  for tool in racecheck memcheck; do
    log="$OUT/san_$tool.log"
    t 60 compute-sanitizer --tool "$tool" --error-exitcode 3 --kernel-name kns=gate_cumsum \
      "$NEW" run examples/fox.attn --backend cuda --shape B=1,H=2,T=9000,D=64 >"$log" 2>&1
    rc=$?
    echo "san $tool gate_cumsum rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: $tool"; tail -8 "$log"; }
  done
  sanitize memcheck "$NEW" B=1,H=2,T=777,D=64 || { fail=1; echo "FAILED: memcheck all"; }
fi

echo "## (c) timings: foxc bench --iters ${ITERS:=50}, base / new / new-serial interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=1,H=1,T=16384,D=128 B=1,H=1,T=8192,D=128 B=1,H=2,T=16384,D=64 B=1,H=16,T=32768,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for v in base new new-serial; do
        bin=$BASE; [ $v != base ] && bin=$NEW
        ser=0; [ $v = new-serial ] && ser=1
        FOXC_SERIAL_LAUNCHES=$ser bench_rows "$v,r$round" "$bin" "$s"
      done
    done
  done | tee "$OUT/prelude_ab.csv"
fi

echo "## (d) ncu kernel durations (gpu__time_duration, us; ncu serializes the launches)"
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  for c in "B=1,H=1,T=16384,D=128 - ." "B=1,H=1,T=16384,D=128 --no-prune ." \
    "B=1,H=16,T=32768,D=128 - gate|threshold"; do
    set -- $c; x=$2; [ "$x" = - ] && x=""
    for v in base new; do
      bin=$BASE; [ $v = new ] && bin=$NEW
      echo "# ncu $v $1 ${x:-pruned}"
      kernel_durations "$bin" "$1" "$3" $x
    done
  done | tee "$OUT/prelude_ncu.txt"
fi
echo "prelude: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
