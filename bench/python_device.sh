#!/usr/bin/env bash
# The Python package on the GPU machine, in one call (issue 10): bench/python_gpu.py (outputs and
# gradients against torch autograd of eager f32 references, torch.compile of forward and backward,
# CUDA graphs, determinism, no host sync, errors) and the forward + backward race of FoX
# (bench/peers.py --grad --foxc: FlexAttention + ACP with and without the gate's gradient, dense
# Flex, foxc through its torch op; the published kernel quoted) at the 4 standard T, same inputs.
#
# Here:   CARGO_TARGET_DIR=/work/tgt/A .tools/py/bin/maturin build --profile dev -m python/Cargo.toml -o .devbin/h7
#         (and the foxc binary for `foxc inputs`, e.g. .devbin/foxc from the release build)
# There:  OUT=$OUT FOXC=.devbin/foxc bash bench/python_device.sh [D]      (carry: .devbin)
# Steps can be skipped: GPU_CHECKS=0 or RACE=0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp/python_device}
mkdir -p "$OUTDIR"
FOXC=${FOXC:-target/release/foxc}
SITE=/tmp/foxc_site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${WHEEL_DIR:-.devbin/h7}"/foxc-*.whl || exit 1
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
status=0
if [ "${GPU_CHECKS:-1}" != 0 ]; then
  python3 bench/python_gpu.py --json "$OUTDIR/python_gpu.json" 2>&1 | tee "$OUTDIR/python_gpu.log"
  status=${PIPESTATUS[0]}
fi
if [ "${RACE:-1}" != 0 ]; then
  D=${1:-128}
  ins=()
  for T in 4096 8192 16384 32768; do
    in="/tmp/pyrace_${T}_${D}.safetensors"
    "$FOXC" inputs examples/fox.attn --shape "B=$((32768 / T)),H=16,T=$T,D=$D" --seed 0 -o "$in" >/dev/null || exit 1
    ins+=("$in")
  done
  python3 bench/peers.py "${ins[@]}" --grad --foxc 2>&1 | tee "$OUTDIR/peers_grad.csv"
fi
exit "$status"
