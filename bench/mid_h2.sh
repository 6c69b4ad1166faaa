#!/usr/bin/env bash
# h2 (GPU plumbing) device checks, for the integrator's midpoint call: the generic NVPTX loops
# against the f64 interpreter (tests/generic/*.attn at their '# shape:'), FoX + ALiBi forward
# (its gate runs in the generic loops), forward time of FoX vs FoX + ALiBi, and the gradient
# programs through run_outputs (`foxc grad --backend cuda --check`). If .devbin/h2/foxc_broken.gz
# is there (a build whose warp cumsum drops the carry), its cumsum checks must FAIL.
# Needs FOXC (default .devbin/foxc). Writes $OUT/h2/log.txt. Always exits 0.
F=${FOXC:-.devbin/foxc}
LOG=${OUT:-/tmp}/h2
mkdir -p "$LOG"
exec > >(tee "$LOG/log.txt") 2>&1
shape_of() { sed -n 's/^# shape: //p' "$1"; }
t0=$(date +%s)
echo "== h2: generic corner programs on the GPU (--check: f64 interpreter, all rows)"
for f in tests/generic/*.attn; do
  echo "-- $f [$(shape_of "$f")]"
  timeout 20 "$F" run "$f" --backend cuda --shape "$(shape_of "$f")" --check --seed 7 2>&1 | grep -E "rel L2|check:|error" | head -3
done
if [ -f .devbin/h2/foxc_broken.gz ]; then
  echo "== h2: a build with a broken warp cumsum (carry dropped): these checks must FAIL"
  gunzip -c .devbin/h2/foxc_broken.gz > /tmp/foxc_broken && chmod +x /tmp/foxc_broken
  for f in tests/generic/fox_alibi_gate.attn; do
    echo "-- $f"; timeout 20 /tmp/foxc_broken run "$f" --backend cuda --shape "$(shape_of "$f")" --check 2>&1 | grep -E "rel L2|check|error" | head -2
  done
fi
echo "== h2: FoX + ALiBi forward"
timeout 30 "$F" run examples/fox_alibi.attn --backend cuda --shape B=1,H=4,T=4096,D=64 --check 2>&1 | grep -E "pruning|rel L2|check:|error"
timeout 60 "$F" run examples/fox_alibi.attn --backend cuda --shape B=2,H=16,T=16384,D=128 --check 2>&1 | grep -E "pruning|rel L2|check:|error"
echo "== h2: forward time, FoX vs FoX + ALiBi (1x16x32768x128, median of 20)"
for ex in fox fox_alibi; do timeout 60 "$F" bench "examples/$ex.attn" --backend cuda --shape B=1,H=16,T=32768,D=128 --iters 20 2>&1 | tail -2; done
echo "== h2: gradient programs on the GPU (B=1,H=4,T=512,D=64; --check vs the interpreter)"
for ex in fox fox_alibi fox_qknorm fox_softcap fox_loggate window alibi_m; do
  echo "-- $ex"; timeout 30 "$F" grad "examples/$ex.attn" --backend cuda --shape B=1,H=4,T=512,D=64 --check 2>&1 | grep -E "check|error" | head -9
done
echo "-- fox_gqa"; timeout 30 "$F" grad examples/fox_gqa.attn --backend cuda --shape B=1,H=4,G=2,T=512,D=64 --check 2>&1 | grep -E "check|error" | head -9
echo "== h2 done in $(( $(date +%s) - t0 )) s"
exit 0
