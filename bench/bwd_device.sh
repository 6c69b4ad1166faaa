#!/usr/bin/env bash
# Issue 9's device call for the sm_90a wgmma backward (h1-wgmma-bwd, session 3): gradient checks
# of the new build against the f64 interpreter, determinism, compute-sanitizer, then forward +
# backward timings of the new build against the mma.sync base, interleaved, on the same card.
# Binaries (stripped, gzipped, carried): .devbin/h1/foxc-<v>.gz for the builds named by VARIANTS
# (default: new, the committed code) and, when present, base (a build from before the wgmma
# backward: mma.sync; timed only). FOXC_NEW=path uses that binary as `new` (e.g. the
# integrator's target/release/foxc). Run 1 (docs/GPU_KERNEL.md) had VARIANTS="new2 new"; new2
# issued S and dP as two wgmma groups (P computed while dP ran): no measurable gain, not kept.
# Every command has a timeout: a kernel that deadlocks on its barriers must not eat the lease.
# Knobs: CHECKS=0 skips the checks, SAN=0 the sanitizers, NCU=0 the ncu kernel split, SHAPES
# (timed shapes), TILES (extra --tiles of the first build, timed too), ROUNDS (interleaved rounds,
# 0: none), ITERS. Run 1 took 280 s of a 290 s call without reaching the sanitizers: split it.
# Usage on the GPU machine: bench/bwd_device.sh   (results under $OUT)
# The sanitizers and the ncu split alone (what run 1 did not reach), with the integrator's build:
#   FOXC_NEW=target/release/foxc CHECKS=0 ROUNDS=0 timeout 200 bench/bwd_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
VARIANTS=${VARIANTS:-new}
BASE=; [ -f .devbin/h1/foxc-base.gz ] && BASE=base
for v in $BASE $VARIANTS; do
  if [ "$v" = new ] && [ -n "${FOXC_NEW:-}" ]; then cp "$FOXC_NEW" /tmp/foxc-new; else
    gunzip -c ".devbin/h1/foxc-$v.gz" > "/tmp/foxc-$v"; fi
  chmod +x "/tmp/foxc-$v"
done
FIRST=${VARIANTS%% *}
NEW=/tmp/foxc-$FIRST
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
t() { timeout "${TMO:-60}" "$@"; }
fail=0

if [ "${CHECKS:-1}" = 1 ]; then
  echo "## foxc grad --backend cuda --check (every gradient vs the f64 interpreter)" | tee "$OUT/check.txt"
  CASES=${CASES:-"fox:B=1,H=1,T=64,D=64 fox:B=1,H=1,T=64,D=128 fox:B=2,H=3,T=777,D=64 fox:B=2,H=3,T=777,D=128
    fox:B=1,H=1,T=4096,D=128 fox_gqa:B=1,H=4,G=2,T=1000,D=64 fox_gqa:B=1,H=4,G=2,T=1000,D=128
    fox_softcap:B=1,H=4,T=1000,D=64 fox_softcap:B=1,H=4,T=1000,D=128 window:B=1,H=4,T=1000,D=64
    window:B=1,H=4,T=1000,D=128 causal:B=1,H=4,T=1000,D=64 causal:B=1,H=4,T=1000,D=128 fox_loggate:B=1,H=4,T=1000,D=128"}
  QUICK=${QUICK:-"fox:B=2,H=3,T=777,D=64 fox:B=2,H=3,T=777,D=128 fox_gqa:B=1,H=4,G=2,T=1000,D=128"}
  for v in $VARIANTS; do
  cases=$CASES; [ "$v" = "$FIRST" ] || cases=$QUICK
  for c in $cases; do
    ex=${c%%:*}; shape=${c#*:}
    extras=("")
    case "$shape" in *T=777*) [ "$ex" = fox ] && extras=("" "--no-prune" "--tiles 64x128") ;;
      *T=4096*) extras=("" "--tiles 64x128") ;; esac
    [ "$v" = "$FIRST" ] || extras=("")
    for extra in "${extras[@]}"; do
      t /tmp/foxc-$v grad "examples/$ex.attn" --backend cuda --check --shape "$shape" $extra -o /tmp/g.safetensors > /tmp/g.txt 2>&1
      rc=$?
      cat /tmp/g.txt >> "$OUT/check_full.txt"
      # The worst gradient (rel L2), the verdict, and any error line.
      line="$(awk '/rel L2/ {v=$5+0; if (v >= w) {w=v; n=$2}} END {if (n != "") printf "worst %s %.2e", n, w}' /tmp/g.txt)"
      line="$line $(grep -E '^ *check:|error' /tmp/g.txt | tr '\n' ' ' | cut -c1-300)"
      echo "$v $ex [$shape] $extra rc=$rc $line" | tee -a "$OUT/check.txt"
      [ "$rc" -eq 0 ] || fail=1
    done
  done
  done
  echo "## determinism: two runs, same bytes" | tee -a "$OUT/check.txt"
  for s in B=1,H=2,T=3000,D=128 B=1,H=4,T=1000,D=64; do
    t $NEW grad examples/fox.attn --backend cuda --shape "$s" -o /tmp/d1.safetensors >/dev/null 2>&1
    t $NEW grad examples/fox.attn --backend cuda --shape "$s" -o /tmp/d2.safetensors >/dev/null 2>&1
    if cmp -s /tmp/d1.safetensors /tmp/d2.safetensors; then r=same; else r=DIFFERENT; fail=1; fi
    echo "fox [$s] $r" | tee -a "$OUT/check.txt"
  done
fi

echo "## forward + backward (foxc bench --grad), median ms, interleaved variants and base" | tee "$OUT/bench.txt"
SHAPES=${SHAPES:-"B=1,H=16,T=32768,D=128 B=8,H=16,T=4096,D=128"}
for r in $(seq "${ROUNDS:-2}"); do
  for s in $SHAPES; do
    for v in $VARIANTS $BASE; do
      for tl in "" ${TILES:-64x128}; do
        [ "$v" != "$FIRST" ] && [ -n "$tl" ] && continue
        row=$(t /tmp/foxc-$v bench examples/fox.attn --backend cuda --grad --shape "$s" --iters "${ITERS:-20}" \
          ${tl:+--tiles $tl} --format csv 2>&1 | tail -n +2 | tr '\n' ' ')
        echo "round=$r $v tiles=${tl:-default} [$s] $row" | tee -a "$OUT/bench.txt"
      done
    done
  done
done
if [ "${SAN:-1}" = 1 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in memcheck racecheck; do
    for s in ${SAN_SHAPES:-B=1,H=2,T=300,D=128}; do
      t "$CS" --tool $tool --error-exitcode 9 $NEW grad examples/fox.attn --backend cuda --shape "$s" \
        -o /tmp/s.safetensors > "$OUT/san_${tool}_${s//[,=]/_}.txt" 2>&1
      rc=$?
      echo "sanitizer $tool [$s] rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${tool}_${s//[,=]/_}.txt" | tr '\n' ' ')" |
        tee -a "$OUT/check.txt"
      [ "$rc" -eq 0 ] || fail=1
    done
  done
fi


if [ "${NCU:-1}" = 1 ]; then
  # Kernel split of one gradient run at the standard shape (ncu fixes no clocks: --clock-control none).
  for v in $FIRST $BASE; do
    t ncu --clock-control none --metrics gpu__time_duration.sum -k regex:foxc_attn \
      /tmp/foxc-$v grad examples/fox.attn --backend cuda --shape B=1,H=16,T=32768,D=128 -o /tmp/n.safetensors \
      > "$OUT/ncu_$v.txt" 2>&1
    echo "ncu $v rc=$?: $(grep -E '^\s+foxc_attn|gpu__time_duration' "$OUT/ncu_$v.txt" | paste - - | awk '{print $1, $(NF)}' | tr '\n' ' ')" |
      tee -a "$OUT/bench.txt"
  done
fi
echo "fail=$fail"
