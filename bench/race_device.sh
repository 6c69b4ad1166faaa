#!/usr/bin/env bash
# The standard-workload races of issues 9 and 11 in one device call, same inputs for every
# contestant (`foxc inputs examples/fox.attn --seed 0`, B = 32768 / T, H = 16):
# - forward: foxc (pruned, --no-prune), FlexAttention + ACP and SDPA (bench/peers.py, one process
#   for all shapes so torch.compile's cache is shared);
# - forward + backward: foxc `bench --grad` (the whole gradient program) and FlexAttention + ACP with
#   and without the gate's gradient (bench/peers.py --grad).
# Usage (GPU machine): FOXC=/path/to/foxc bench/race_device.sh
# Knobs: FWD128, FWD64, GRAD128 (lists of T; empty skips), OUT (results folder), PEERS_FWD (flags of
# the forward peers.py, e.g. --foxc: foxc's torch op as well, with the wheel on PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FOXC=${FOXC:?set FOXC to the foxc binary}
input() {  # D T -> path of the inputs file (made once)
  local in="/tmp/race_in_$2_$1.safetensors"
  [ -f "$in" ] || "$FOXC" inputs examples/fox.attn --shape "B=$((32768 / $2)),H=16,T=$2,D=$1" --seed 0 -o "$in" >/dev/null
  echo "$in"
}
fwd() {  # D T...
  local D=$1; shift; local ins=()
  for T in "$@"; do
    local shape="B=$((32768 / T)),H=16,T=$T,D=$D"; ins+=("$(input "$D" "$T")")
    for np in "" "--no-prune"; do
      timeout 60 "$FOXC" bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters 50 $np \
        --format csv | tail -n +2 | sed "s/^/foxc${np:+-noprune},/" | tee -a "$OUT/fwd.csv"
    done
  done
  # shellcheck disable=SC2086  # PEERS_FWD: a word list
  timeout 240 python3 bench/peers.py "${ins[@]}" --no-dense-flex --no-ref ${PEERS_FWD:-} 2>&1 | tee -a "$OUT/fwd_peers.csv"
}
grad() {  # D T...
  local D=$1; shift; local ins=()
  for T in "$@"; do
    ins+=("$(input "$D" "$T")")
    timeout 90 "$FOXC" bench examples/fox.attn --backend cuda --grad --shape "B=$((32768 / T)),H=16,T=$T,D=$D" \
      --seed 0 --iters 20 --format csv | tail -n +2 | sed "s/^/foxc-grad,/" | tee -a "$OUT/grad.csv"
  done
  timeout 300 python3 bench/peers.py "${ins[@]}" --grad --no-dense-flex 2>&1 | tee -a "$OUT/grad_peers.csv"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
[ -n "${GRAD128-8192 32768 4096 16384}" ] && grad 128 ${GRAD128-8192 32768 4096 16384}
[ -n "${FWD128-4096 8192 16384 32768}" ] && fwd 128 ${FWD128-4096 8192 16384 32768}
[ -n "${FWD64-16384 32768}" ] && fwd 64 ${FWD64-16384 32768}
echo "race_device: done"
