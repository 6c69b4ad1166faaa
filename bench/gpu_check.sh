#!/usr/bin/env bash
# GPU correctness on the H200 (issue 5, item 5): foxc --backend cuda --check against the f64
# reference on the standard workload and odd shapes, pruned and --no-prune, and
# compute-sanitizer memcheck/racecheck on a small case. Needs target/release/foxc (carried).
set -uo pipefail
cd "$(dirname "$0")/.."
FOXC=${FOXC:-target/release/foxc}
fail=0
run() {
  echo "### foxc run $*"
  # The status is foxc's own: captured before any filter (a `| grep || true` would report
  # the filter's).
  local out rc
  out=$("$FOXC" run "$@" --backend cuda --check 2>&1); rc=$?
  grep -E "pruning|starts|time|check|error" <<<"$out"
  [ "$rc" -eq 0 ] || { echo "FAILED (exit $rc): $*"; fail=1; }
}
run examples/fox.attn --shape B=8,H=16,T=4096,D=128
run examples/fox.attn --shape B=8,H=16,T=4096,D=128 --no-prune
run examples/fox.attn --shape B=8,H=16,T=4096,D=64
run examples/fox.attn --shape B=2,H=16,T=16384,D=128
run examples/fox.attn --shape B=2,H=16,T=16384,D=128 --prune-rule tight
# Every rule of the table (`foxc rules`): the NVPTX threshold kernels render each formula, and
# --check-starts compares the attention kernel's in-kernel block starts (a debug build writes
# them out) with the reference's: equal, or a near tie of the f32 threshold (counted).
for rule in $("$FOXC" rules | sed -nE 's/^([a-z][a-z0-9-]*): .*/\1/p'); do
  run examples/fox.attn --shape B=1,H=8,T=4096,D=128 --prune-rule "$rule" --check-starts
  run examples/fox_gqa.attn --shape B=1,H=8,G=2,T=2048,D=64 --prune-rule "$rule" --check-starts
  run examples/fox_softcap.attn --shape B=1,H=4,T=2048,D=64 --prune-rule "$rule" --check-starts
done
run examples/fox.attn --shape B=2,H=16,T=16384,D=128 --check-starts
run examples/fox.attn --shape B=1,H=3,T=1000,D=64 --tiles 128x64 --check-starts
run examples/fox.attn --shape B=2,H=16,T=16384,D=64
run examples/fox.attn --shape B=1,H=3,T=1000,D=128
run examples/fox.attn --shape B=1,H=1,T=1,D=64
run examples/fox.attn --shape B=1,H=1,T=777,D=64
run examples/fox_qknorm.attn --shape B=1,H=4,T=2048,D=128
run examples/fox_loggate.attn --shape B=1,H=4,T=2048,D=64
run examples/alibi.attn --shape B=1,H=4,T=2048,D=64
run examples/causal.attn --shape B=1,H=4,T=2048,D=128
run examples/window.attn --shape B=1,H=4,T=2048,D=64
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    echo "### compute-sanitizer --tool $tool"
    out=$(compute-sanitizer --tool "$tool" --error-exitcode 9 "$FOXC" run examples/fox.attn --backend cuda \
      --shape B=1,H=2,T=300,D=128 2>&1); rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|error|Error" <<<"$out" | head -5
    [ "$rc" -eq 0 ] || { echo "FAILED (exit $rc): sanitizer $tool"; fail=1; }
  done
fi
echo "gpu_check: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
exit $fail
