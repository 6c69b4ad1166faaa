#!/usr/bin/env bash
# The fifth session's last device call (issue 11): the final build checked (graph submission by
# default, run 13's D = 64 choice), then the forward race of issue 11 item 5 in one run
# (bench/race_device.sh: foxc pruned and --no-prune, FlexAttention + ACP, SDPA; D = 128 at the four
# standard T, D = 64 at 16k / 32k), then pruned against --no-prune at small shapes (item 3).
# Usage (GPU machine): OUT=$OUT bash bench/final5_device.sh   (carry .devbin/final5)
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/out}/final5; mkdir -p "$R"
source bench/device_lib.sh  # unpack, check_cuda, bench_rows
F=$(unpack .devbin/final5/foxc.gz)
exec > >(tee "$R/final5.log") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "## checks of the final build"
fail=0
check() { check_cuda "$F" "$@" || fail=1; }
if [ "${CHECK:-1}" = 1 ]; then
  check run fox B=1,H=3,T=777,D=128
  check run fox B=1,H=2,T=8291,D=64
  check run fox B=1,H=2,T=4099,D=64 --no-prune
  check run fox_gqa B=1,H=4,G=2,T=1000,D=64
  check run fox_softcap B=1,H=2,T=1000,D=64
  check grad fox B=1,H=2,T=1000,D=64
  check grad fox B=1,H=2,T=1000,D=128
fi
echo "checks: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
echo "## forward race"
FOXC=$F OUT=$R GRAD128= timeout "${RACE_TMO:-330}" bash bench/race_device.sh >/dev/null 2>&1
echo "race rc=$?"
cat "$R/fwd.csv" "$R/fwd_peers.csv" 2>/dev/null
echo "## pruned vs --no-prune at small shapes (graph submission)"
if [ "${SMALL:-1}" = 1 ]; then
  for s in B=1,H=1,T=16384,D=128 B=1,H=1,T=4096,D=128 B=1,H=1,T=2048,D=128 B=1,H=2,T=16384,D=64 B=1,H=1,T=4096,D=64; do
    ITERS=200 bench_rows small "$F" "$s"
  done
fi
tar czf "${OUT:-/tmp/out}/final5.tgz" -C "$R" . && rm -rf "$R"
[ $fail = 0 ]
