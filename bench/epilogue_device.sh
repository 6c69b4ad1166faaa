#!/usr/bin/env bash
# The elementwise programs around an attention on the GPU, NEW against OLD in one call: RoPE on q
# and k (bench/fox_rope.attn) and an output gate (bench/fox_gate.attn). Checks (`--check`
# against the f64 interpreter, forward and gradients) of NEW, then `foxc bench` of both builds
# interleaved, with examples/fox.attn as the control (the same kernel in both programs).
#   NEW=foxc.gz OLD=foxc.gz [EXTRA="prog.attn ..."] [SHAPE=B=2,H=16,T=8192,D=128] bench/epilogue_device.sh
# EXTRA programs get the forward check only (at the check shape).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
OUT=${OUT:-/tmp}
new=$(unpack "$NEW")
old=$(unpack "$OLD")
shape=${SHAPE:-B=2,H=16,T=8192,D=128}
small=B=1,H=4,T=1000,D=128
# A whole-program output (not the attention's own) is checked against the full reference: smaller.
tiny=B=1,H=2,T=300,D=64
fail=0
for f in bench/fox_rope.attn bench/fox_gate.attn; do
  for what in run grad; do
    sh=$small; [ $what = run ] && [ $f = bench/fox_gate.attn ] && sh=$tiny
    out=$(t 120 "$new" "$what" "$f" --backend cuda --check --shape "$sh" 2>&1)
    rc=$?
    echo "check $what $f [$sh] rc=$rc $(grep -iE 'check|error|rel' <<<"$out" | tail -8 | tr '\n' ' ')"
    [ $rc -eq 0 ] || fail=1
  done
done
for f in ${EXTRA:-}; do
  out=$(t 120 "$new" run "$f" --backend cuda --check --shape "${EXTRA_SHAPE:-$tiny}" 2>&1)
  rc=$?
  echo "check run $f [${EXTRA_SHAPE:-$tiny}] rc=$rc $(grep -iE 'check|error|rel' <<<"$out" | tail -8 | tr '\n' ' ')"
  [ $rc -eq 0 ] || fail=1
done
echo "== bench $shape (median ms of ${ITERS:-30}; NEW and OLD interleaved, twice, each first once)"
bench_interleaved "$new" "$old" "$shape" "${ITERS:-30}" examples/fox.attn bench/fox_gate.attn bench/fox_rope.attn
exit $fail
