#!/usr/bin/env bash
# The integrator's last device call of the third session of 2026-12-01: one build of main
# (.devbin/fin/foxc.gz, and the wheel when cp_sim runs), most important first, every step under
# a timeout and writing under $OUT as it goes (a call cut short still returns what ran).
#   1. GPU checks of the build against the f64 interpreter: gradients (the wgmma backward; the
#      backward's results read in place since 8b72b2e; the compensated gate scan of fbe4d76),
#      the warp-specialized forward, an expression mask.
#   2. Issue 9's forward + backward race (bench/race_device.sh, grad part).
#   3. compute-sanitizer and the ncu kernel split of the wgmma backward (bench/bwd_device.sh).
#   4. Issue 12.5 on the GPU (bench/numerics_device.sh, T = 4096).
#   5. Issue 13's one-GPU context-parallel simulation, small (bench/cp_sim_device.sh).
#   6. The forward race again when FWD128 is set (a new forward kernel).
# Usage (GPU machine): OUT=$OUT bench/final_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$OUT/steps.txt"; }
gunzip -c .devbin/fin/foxc.gz > /tmp/foxc && chmod +x /tmp/foxc || exit 1
export FOXC=/tmp/foxc
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

stamp "1. checks"
check() {  # foxc subcommand and arguments; --backend cuda --check added
  local out rc
  out=$(timeout 60 "$FOXC" "$@" --backend cuda --check 2>&1); rc=$?
  echo "### foxc $* rc=$rc" >> "$OUT/checks.txt"
  grep -E "check|error" <<<"$out" >> "$OUT/checks.txt"
  [ "$rc" -eq 0 ] || echo "FAILED (exit $rc): foxc $*" | tee -a "$OUT/checks.txt"
}
check grad examples/fox.attn --shape B=1,H=4,T=1000,D=128
check grad examples/fox.attn --shape B=2,H=3,T=777,D=64
check grad examples/fox_gqa.attn --shape B=1,H=4,G=2,T=1000,D=64
check grad examples/fox_alibi.attn --shape B=1,H=4,T=512,D=64
check grad examples/fox_softcap.attn --shape B=1,H=4,T=1000,D=128
# h5's backward extensions: D = 256 (cbdc67f), expression masks and no mask (e5365fa), captured
# [B, H, T] tensors read at i or j (72a330a).
for a in "fox.attn B=1,H=2,T=777,D=256" "fox.attn B=1,H=2,T=1000,D=256 --no-prune" \
  "fox_gqa.attn B=1,H=4,G=2,T=500,D=256" "window.attn B=1,H=2,T=600,D=256" "fox_softcap.attn B=1,H=2,T=333,D=256" \
  "local_bidir.attn B=2,H=2,T=300,D=64" "local_bidir.attn B=1,H=2,T=777,D=128" "local_bidir.attn B=1,H=2,T=333,D=256" \
  "refuse_noncausal.attn B=1,H=2,T=200,D=64" "fox_keybias.attn B=2,H=2,T=300,D=64" \
  "fox_keybias.attn B=1,H=2,T=777,D=128" "fox_keybias.attn B=1,H=2,T=333,D=256"; do
  set -- $a
  check grad "examples/$1" --shape "$2" ${3:-}
done
for s in B=2,H=2,T=300,D=64 B=1,H=2,T=777,D=128 B=1,H=2,T=333,D=256; do
  check grad codegen/tests/programs/query_temp.attn --shape "$s"  # a capture read by query row
done
check run examples/fox.attn --shape B=2,H=16,T=4096,D=128 --check-starts
check run examples/fox.attn --shape B=1,H=4,T=2048,D=64
check run examples/local_bidir.attn --shape B=1,H=4,T=1000,D=64
check run codegen/tests/programs/time_window.attn --shape B=2,H=4,T=1000,D=128
grep -c "FAILED" "$OUT/checks.txt" | sed 's/^/failed checks: /' | tee -a "$OUT/steps.txt"

stamp "2. forward + backward race"
GRAD128=${GRAD128-32768 8192 16384 4096} FWD128= FWD64= timeout "${RACE_TMO:-200}" bench/race_device.sh > "$OUT/race.log" 2>&1

stamp "3. sanitizers and ncu split of the backward"
FOXC_NEW=$FOXC CHECKS=0 ROUNDS=0 TMO=45 timeout 90 bench/bwd_device.sh > "$OUT/bwd.log" 2>&1

for a in "fox.attn B=1,H=1,T=200,D=256" "fox_keybias.attn B=1,H=1,T=200,D=64"; do
  set -- $a
  out=$(timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$FOXC" grad "examples/$1" --backend cuda \
    --shape "$2" 2>&1); rc=$?
  echo "racecheck grad $a rc=$rc $(grep -E 'RACECHECK SUMMARY' <<<"$out")" | tee -a "$OUT/steps.txt"
done

stamp "4. f32 numerics"
NUM_T=${NUM_T:-4096} timeout 45 bench/numerics_device.sh > "$OUT/numerics.log" 2>&1; echo "numerics rc=$?" >> "$OUT/numerics.log"

if [ "${CP:-1}" = 1 ] && ls .devbin/fin/foxc-*.whl >/dev/null 2>&1; then
  stamp "5. context parallelism on one GPU"
  mkdir -p .devbin/cp && cp .devbin/fin/foxc.gz .devbin/fin/foxc-*.whl .devbin/cp/
  MASKS=0 GLOO=0 CP_T=${CP_T:-131072} CP_P=${CP_P:-2} REPS=1 timeout "${CP_TMO:-100}" bash bench/cp_sim_device.sh \
    > "$OUT/cp.log" 2>&1
fi

if [ -n "${FWD128:-}" ]; then
  stamp "6. forward race"
  GRAD128= FWD64= timeout 150 bench/race_device.sh > "$OUT/race_fwd.log" 2>&1
fi
stamp "done"
