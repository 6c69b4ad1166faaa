#!/usr/bin/env bash
# The fourth session's last device call (issue 11): the final build (TMA K/V loads by default, the
# prologue / epilogue of run 10, the prelude of h7) checked, then the forward race of issue 11
# item 5 in one run (bench/race_device.sh: foxc pruned and --no-prune, FlexAttention + ACP, SDPA),
# then the Python package's GPU checks (bench/python_gpu.py) on the same build.
# Usage (GPU machine): OUT=$OUT bash bench/final4_device.sh   (carry .devbin/final, .devbin/wheel)
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/out}/final4; mkdir -p "$R"
F=/tmp/final4/foxc; mkdir -p /tmp/final4
gunzip -c .devbin/final/foxc.gz > "$F" && chmod +x "$F"
exec > >(tee "$R/final4.log") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "## checks of the final build"
fail=0
source bench/device_lib.sh  # check_cuda
check() { check_cuda "$F" "$@" || fail=1; }
check run fox B=1,H=3,T=777,D=128
check run fox B=1,H=1,T=8291,D=128
check run fox B=1,H=2,T=4099,D=128 --no-prune
check run fox_gqa B=1,H=4,G=2,T=1000,D=128
check run fox_keybias B=1,H=4,T=1000,D=128
check run fox B=1,H=2,T=777,D=128 --tiles 64x64
check grad fox B=1,H=2,T=1000,D=128
check grad fox_softcap B=1,H=2,T=333,D=128
echo "checks: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
echo "## forward race"
FOXC=$F OUT=$R GRAD128= timeout ${RACE_TMO:-240} bash bench/race_device.sh >/dev/null 2>&1
echo "race rc=$?"
cat "$R/fwd.csv" "$R/fwd_peers.csv" 2>/dev/null
echo "## python package on the GPU"
SITE=/tmp/foxc_site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .devbin/wheel/foxc-*.whl
PYTHONPATH=$SITE PYTHONUNBUFFERED=1 timeout ${PY_TMO:-100} python3 bench/python_gpu.py --json "$R/python_gpu.json" > "$R/python_gpu.log" 2>&1
echo "python_gpu rc=$?"; grep -ciE "^ok|pass" "$R/python_gpu.log"; grep -iE "fail|error" "$R/python_gpu.log" | head -5; tail -3 "$R/python_gpu.log"
tar czf "${OUT:-/tmp/out}/final4.tgz" -C "$R" . && rm -rf "$R"
