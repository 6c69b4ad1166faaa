#!/usr/bin/env bash
# q's load map (RoPE) in the GPU kernels (`--q-map kernel`) against the loop (`--q-map loop`,
# a GPU's default), one build in one call: checks of the map (`--check` against the f64
# interpreter on the warp-specialized, standard and mma.sync kernels, queries fewer than keys,
# `--check-starts` of a map that changes q's norms, f16, the gradients), memcheck, then `foxc
# bench` of both choices interleaved twice (each first once), examples/fox.attn the control.
#   FOXC=foxc.gz [SHAPE=B=1,H=16,T=8192] [ITERS=20] bench/load_map_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
log_to log.txt
bin=$(unpack "$FOXC")
shape=${SHAPE:-B=1,H=16,T=8192}
R=bench/fox_rope.attn; Q=bench/fox_rope_gqa.attn; P=bench/fox_rope_prefill.attn
# The f16 form of the RoPE program (the map rounds to f16, the Q tile's type).
F="$OUT/fox_rope_f16.attn"
sed 's/bf16/f16/g' $R > "$F"
fail=0
for args in "run $R B=1,H=3,T=999,D=128" "run $R B=1,H=3,T=333,D=96" "run $R B=1,H=3,T=1777,D=64 --attn-kernel standard" \
  "run $Q B=2,H=4,G=2,T=2000,D=128 --check-starts" "run $P B=1,H=3,N=300,M=2000,D=128" "run $P B=1,H=3,N=1,M=3000,D=128" \
  "run $F B=1,H=3,T=999,D=128" "grad $R B=1,H=2,T=300,D=64"; do
  # shellcheck disable=SC2086  # a word list
  check_cuda "$bin" $args --q-map kernel || fail=1
done
t 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin" run $Q --backend cuda --shape B=1,H=4,G=2,T=500,D=128 \
  --q-map kernel > "$OUT/san.log" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/san.log")"
echo "== bench $shape (median ms of ${ITERS:-20}; kernel and loop interleaved, twice, each first once)"
for rep in 1 2; do
  order="kernel loop"; [ "$rep" = 2 ] && order="loop kernel"
  for spec in "examples/fox.attn D=128" "$R D=128" "$R D=64" "$Q D=128,G=4"; do
    read -r f dims <<<"$spec"
    for mode in $order; do
      t 120 "$bin" bench "$f" --backend cuda --shape "$shape,$dims" --seed 0 --iters "${ITERS:-20}" --q-map "$mode" \
        --format csv 2>&1 | grep -v '^program' | sed "s|^|$rep,$mode,|"
    done
  done
done
exit $fail
