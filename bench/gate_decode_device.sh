#!/usr/bin/env bash
# A decode step's output gate applied by the split-keys merge (bench/fox_gate_cache.attn), NEW
# against OLD in one call: checks of NEW (`--check` against the f64 interpreter, one and 16
# queries, D = 128 and 64, dense), memcheck, then `foxc bench` of both builds interleaved twice,
# examples/fox_cache.attn the control (no gate). Lines also go to $OUT/log.txt as they come, so
# a call cut off by its limit still returns them.
#   NEW=foxc.gz OLD=foxc.gz [ITERS=50] bench/gate_decode_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_lib.sh
log_to log.txt
new=$(unpack "$NEW")
old=$(unpack "$OLD")
G=bench/fox_gate_cache.attn
fail=0
for args in "B=1,H=3,N=1,M=3000,D=128" "B=2,H=4,N=16,M=5000,D=128" "B=1,H=2,N=1,M=3000,D=64" "B=1,H=2,N=3,M=4500,D=128 --no-prune"; do
  check_cuda "$new" run $G $args || fail=1
done
t 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$new" run $G --backend cuda --shape B=1,H=4,N=2,M=5000,D=128 > "$OUT/san.log" 2>&1
echo "memcheck rc=$? $(grep 'ERROR SUMMARY' "$OUT/san.log")"
echo "== bench H=16,N=1,D=128 (median ms of ${ITERS:-50}; NEW and OLD interleaved, twice, each first once)"
bench_interleaved "$new" "$old" "H=16,N=1,D=128" "${ITERS:-50}" "$G B=8,M=32768" "$G B=1,M=131072" "examples/fox_cache.attn B=1,M=131072"
exit $fail
