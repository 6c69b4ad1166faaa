#!/usr/bin/env bash
# Issue 11 item 3 (never slower than --no-prune): what pruning costs where it prunes nothing.
# For each shape: `foxc bench` pruned and --no-prune (two rounds, interleaved), then ncu's duration
# of every kernel of one pruned and one --no-prune run (ncu serializes launches, so the sum of the
# kernels against the bench time shows the launch gaps), and the warp-specialized kernel's ncu
# sections at NCU_SHAPE (occupancy, tensor pipe, stall reasons) unless NCU_WS=0.
# Usage (GPU machine): FOXC=/path/to/foxc OUT=... bench/overhead_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FOXC=${FOXC:?set FOXC to the foxc binary}
source bench/device_lib.sh  # bench_rows, kernel_durations
SHAPES=${SHAPES:-B=1,H=1,T=16384,D=128 B=1,H=1,T=8192,D=128 B=1,H=2,T=16384,D=64}
for round in 1 2; do
  for s in $SHAPES; do
    for np in "" "--no-prune"; do
      ITERS=200 bench_rows "r$round${np:+ noprune}" "$FOXC" "$s" $np
    done
  done
done | tee "$OUT/overhead.csv"
if command -v ncu >/dev/null; then
  for s in ${SHAPES%% *}; do
    for np in "" "--no-prune"; do
      echo "## ncu kernel durations: $s ${np:-pruned}"
      kernel_durations "$FOXC" "$s" . $np
    done
  done | tee "$OUT/overhead_ncu.txt"
  if [ "${NCU_WS:-1}" = 1 ]; then
    echo "## ncu: the attention kernel at ${NCU_SHAPE:=B=1,H=16,T=32768,D=128}"
    timeout 200 ncu -k regex:foxc_attn_fwd --launch-count 1 \
      --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section SchedulerStats \
      --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
      "$FOXC" run examples/fox.attn --backend cuda --shape "$NCU_SHAPE" --seed 0 >"$OUT/ncu_ws.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "Achieved Occupancy|cycles_active|warps_active|pipe_xu|Registers Per|Duration|Stall|stall|Issue Slots|Executed Ipc|No Eligible|Eligible Warps" "$OUT/ncu_ws.txt" | head -40
  fi
fi
echo "overhead_device: done"
