#!/usr/bin/env bash
# The pruned forms that have run only on the CPU, checked on a GPU in one call: `--check`
# against the f64 interpreter, forward and gradients, pruned and dense, both forward kernels
# (D = 128 warp-specialized on sm_90a, D = 64 standard) and the split-keys decode (N = 1):
# padding beside a window, right padding with its rows masked, a prefill's relative bias, a
# left-padded windowed prefill (the causal mask last in the conjunction, the window's distance
# as a key bound), FoX + ALiBi in a prefill (the ramp at the key position and at the row), a cache's
# stored decay beside ALiBi, sinks beside a window in a left-padded prefill. Then memcheck on two of them, and `foxc bench` of
# each at its CPU table's shape against examples/fox.attn (square) or bench/fox_prefill.attn
# (prefill) in the same call. No peer here: FlexAttention's rows need their own mask_mods.
# Lines also go to $OUT/log.txt as they come. The checks and the timings each take most of a
# call's 600 s: PART=checks or PART=bench runs one (default both).
#   NEW=foxc.gz [PART=checks|bench] [PAR=6] [ITERS=30] bench/new_forms_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
log_to log.txt
new=$(unpack "$NEW")
fail=0
SQUARE="bench/fox_leftpad_window.attn bench/fox_rightpad.attn"
PREFILL="bench/fox_rel_prefill.attn bench/fox_pad_window_prefill.attn bench/fox_alibi_prefill.attn
  bench/fox_alibi_row_prefill.attn bench/fox_cache_alibi.attn bench/fox_sinks_window_prefill.attn"
# The check lines, one `run|grad FILE SHAPE [--no-prune]` each: forward and gradients of each
# file at each shape, pruned and dense.
lines() {
  local files=$1 f shape what
  shift
  for f in $files; do for shape in "$@"; do for what in run grad; do
    # The GPU backward refuses the relative bias table's gradient (a captured [H, U] tensor), as
    # documented; its forward is checked.
    [ "$what $f" = "grad bench/fox_rel_prefill.attn" ] && continue
    echo "$what $f $shape"; echo "$what $f $shape --no-prune"
  done; done; done
}
if [ "${PART:-all}" != bench ]; then
  { lines "$SQUARE" "B=1,H=4,T=1500,D=128" "B=1,H=3,T=777,D=64"
    lines "$PREFILL" "B=1,H=4,N=300,M=1500,D=128" "B=2,H=2,N=100,M=1000,D=64" "B=3,H=2,N=1,M=2500,D=128"
  } > "$OUT/checks.txt"
  # Six at a time (the f64 reference runs on the host's cores; about 570 s on an H100 host).
  export new
  xargs -P "${PAR:-6}" -L 1 bash -c 'source bench/device_lib.sh; check_cuda "$new" "$@"' _ < "$OUT/checks.txt" \
    > "$OUT/checks.log"
  cat "$OUT/checks.log"
  grep -q ' rc=[1-9]' "$OUT/checks.log" && fail=1
  for spec in "bench/fox_rightpad.attn B=1,H=2,T=700,D=128" "bench/fox_pad_window_prefill.attn B=2,H=2,N=300,M=1000,D=128"; do
    read -r f shape <<<"$spec"
    t 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$new" run "$f" --backend cuda --shape "$shape" \
      > "$OUT/san.log" 2>&1
    rc=$?
    echo "memcheck $f [$shape] rc=$rc $(grep 'ERROR SUMMARY' "$OUT/san.log")"
    [ $rc -eq 0 ] || fail=1
  done
fi
[ "${PART:-all}" = checks ] && { echo "new_forms checks: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"; exit $fail; }
echo "== bench (median ms of ${ITERS:-30}; pruned and dense rows)"
for f in examples/fox.attn $SQUARE; do
  t 120 "$new" bench "$f" --backend cuda --shape B=8,H=16,T=4096,D=128 --seed 0 --iters "${ITERS:-30}" --format csv 2>&1 \
    | grep -v '^program'
done
for f in bench/fox_prefill.attn $PREFILL; do
  t 120 "$new" bench "$f" --backend cuda --shape B=8,H=16,N=1024,M=8192,D=128 --seed 0 --iters "${ITERS:-30}" \
    --format csv 2>&1 | grep -v '^program'
done
echo "new_forms: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
exit $fail
