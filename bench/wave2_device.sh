#!/usr/bin/env bash
# Every example on the GPU (`--check`), FoX's speed against a previous binary in the same run
# (interleaved A/B; only with FOXC_BASE, AB=0 skips it), and softcapped and grouped-query FoX
# against FlexAttention + ACP with the same score_mod (bench/peers.py --variant; VARIANTS=0 skips it).
# Usage (GPU machine): FOXC=target/release/foxc [FOXC_BASE=old/foxc] bench/wave2_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
NEW=${FOXC:-target/release/foxc}
BASE=${FOXC_BASE:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

echo "## correctness: every example, --backend cuda --check"
fail=0
for f in examples/*.attn; do
  case "$f" in *refuse_*) continue ;; esac
  shape="B=1,H=4,T=1000,D=64"
  case "$f" in *gqa*) shape="B=1,H=4,G=2,T=1000,D=64" ;; esac
  line=$("$NEW" run "$f" --backend cuda --check --shape "$shape" 2>&1 | grep -E "pruning|check|error" | tr '\n' ' ')
  rc=${PIPESTATUS[0]}
  echo "$f [$shape] rc=$rc $line"
  [ "$rc" -eq 0 ] || fail=1
done
for D in 32 64 96 128 256; do
  line=$("$NEW" run examples/fox.attn --backend cuda --check --shape "B=1,H=3,T=777,D=$D" 2>&1 | grep -E "check|error" | tr '\n' ' ')
  echo "fox D=$D T=777 rc=${PIPESTATUS[0]} $line"
done
echo "correctness: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"

echo "## FoX speed, new vs previous binary (interleaved), D = 128 (AB=0 skips it)"
[ "${AB:-1}" = 1 ] && [ -n "$BASE" ] && for shape in B=1,H=16,T=32768,D=128 B=2,H=16,T=16384,D=128; do
  for rep in 1 2; do
    for bin in "$BASE" "$NEW"; do
      "$bin" bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters 50 --format csv 2>&1 |
        grep -v '^variant' | sed "s|^|$(basename "$bin"),rep$rep,$shape,|"
    done
  done
done | tee "$OUT/fox_ab.csv"

[ "${VARIANTS:-1}" = 1 ] || exit $fail
echo "## variants vs FlexAttention + ACP, 2x16x16384x128"
in_fox=/tmp/in_fox.safetensors
in_gqa=/tmp/in_gqa.safetensors
"$NEW" inputs examples/fox_softcap.attn --shape B=2,H=16,T=16384,D=128 --seed 0 -o "$in_fox" >/dev/null
"$NEW" inputs examples/fox_gqa.attn --shape B=2,H=16,G=4,T=16384,D=128 --seed 0 -o "$in_gqa" >/dev/null
for f in fox fox_softcap; do
  "$NEW" bench examples/$f.attn --backend cuda --shape B=2,H=16,T=16384,D=128 --seed 0 --iters 50 --format csv 2>&1 | sed "s|^|$f,|"
done | tee "$OUT/foxc_variants.csv"
"$NEW" bench examples/fox_gqa.attn --backend cuda --shape B=2,H=16,G=4,T=16384,D=128 --seed 0 --iters 50 --format csv 2>&1 |
  sed "s|^|fox_gqa,|" | tee -a "$OUT/foxc_variants.csv"
python3 bench/peers.py "$in_fox" --variant fox --no-dense-flex --no-ref 2>&1 | tee "$OUT/peers_variants.csv"
python3 bench/peers.py "$in_fox" --variant softcap --no-dense-flex 2>&1 | tee -a "$OUT/peers_variants.csv"
python3 bench/peers.py "$in_gqa" --variant gqa --no-dense-flex 2>&1 | tee -a "$OUT/peers_variants.csv"
exit $fail
