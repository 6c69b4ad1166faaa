#!/usr/bin/env bash
# One device call of the integrator (third session of 2026-12-01): the GPU checks of issue 12
# (bench/gpu_check.sh: every rule, --check-starts, sanitizers), then the forward race (foxc,
# FlexAttention + ACP, SDPA; issue 11) and the forward + backward race (foxc `bench --grad`,
# FlexAttention + ACP with and without the gate's gradient; issue 9) on the same inputs.
# Binary: .devbin/<NAME>/foxc.gz (carried). Usage: NAME=i3 bench/baseline_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
gunzip -c ".devbin/${NAME:-i3}/foxc.gz" > /tmp/foxc && chmod +x /tmp/foxc
export FOXC=/tmp/foxc
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${CHECKS:-1}" = 1 ]; then
  timeout "${CHECK_TMO:-240}" bench/gpu_check.sh > "$OUT/gpu_check.txt" 2>&1; echo "gpu_check rc=$?" | tee -a "$OUT/gpu_check.txt"
  tail -3 "$OUT/gpu_check.txt"
fi
fwd() {  # D T...
  local D=$1; shift
  for T in "$@"; do
    B=$((32768 / T)); shape="B=$B,H=16,T=$T,D=$D"; in="/tmp/in_${T}_${D}.safetensors"
    $FOXC inputs examples/fox.attn --shape "$shape" --seed 0 -o "$in" >/dev/null || return 1
    for np in "" "--no-prune"; do
      timeout 60 $FOXC bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters 50 $np --format csv \
        | sed "s/^/foxc${np:+-noprune},/" | tee -a "$OUT/fwd.csv"
    done
    timeout 120 python3 bench/peers.py "$in" --no-dense-flex --no-ref 2>&1 | tee -a "$OUT/fwd_peers.csv"
  done
}
grad() {  # D T...
  local D=$1; shift; local ins=()
  for T in "$@"; do
    B=$((32768 / T)); shape="B=$B,H=16,T=$T,D=$D"; in="/tmp/in_${T}_${D}.safetensors"
    [ -f "$in" ] || $FOXC inputs examples/fox.attn --shape "$shape" --seed 0 -o "$in" >/dev/null
    ins+=("$in")
    timeout 90 $FOXC bench examples/fox.attn --backend cuda --grad --shape "$shape" --seed 0 --iters 20 --format csv \
      | sed "s/^/foxc-grad,/" | tee -a "$OUT/grad.csv"
  done
  timeout 240 python3 bench/peers.py "${ins[@]}" --grad --no-dense-flex 2>&1 | tee -a "$OUT/grad_peers.csv"
}
[ -n "${FWD128:-4096 8192 16384 32768}" ] && fwd 128 ${FWD128:-4096 8192 16384 32768}
[ -n "${FWD64:-16384 32768}" ] && fwd 64 ${FWD64:-16384 32768}
[ -n "${GRAD128:-8192 32768}" ] && grad 128 ${GRAD128:-8192 32768}
echo done
