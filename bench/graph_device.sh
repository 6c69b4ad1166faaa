#!/usr/bin/env bash
# Issue 11 items 3 and 4: the plan as one CUDA graph (runtime/src/cuda/graph.rs), and the ncu
# figures of the warp-specialized TMA kernel.
# (a) checks with the graph: `--check` of fox (pruned, --no-prune, gradient), fox_gqa, fox_alibi;
#     graph and per-launch submission on the same inputs (bitwise: the same kernels);
# (b) `foxc bench` pruned and --no-prune rows, submission by launches / graph / serial launches,
#     interleaved, ROUNDS rounds at SMALL (ITERS_SMALL runs) and at the standard SHAPES (ITERS);
# (c) ncu durations of every kernel of one pruned and one --no-prune run at the first SMALL shape;
# (d) ncu sections of the attention kernel at NCU_SHAPE (occupancy, tensor pipe, stall reasons).
# Usage (GPU machine): FOXC=.devbin/x/foxc.gz OUT=... bench/graph_device.sh; knobs CHECK=0 TIME=0 NCU=0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/device_lib.sh
FOXC=$(unpack "${FOXC:?set FOXC to the foxc binary (.gz or plain)}")
# The graph variant as a binary of its own, for compare_runs and check_cuda.
GRAPH=$(mktemp -d)/foxc-graph
printf '#!/bin/sh\nFOXC_CUDA_GRAPH=1 exec %s "$@"\n' "$FOXC" >"$GRAPH"; chmod +x "$GRAPH"
fail=0

echo "## (a) checks, submission by graph"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "run fox B=1,H=2,T=777,D=128" "run fox B=1,H=1,T=16384,D=128" "run fox B=2,H=3,T=4099,D=64" \
    "grad fox B=1,H=2,T=777,D=128" "run fox_gqa B=1,H=4,T=1000,D=128,G=2" "run fox_alibi B=1,H=2,T=1000,D=64"; do
    # shellcheck disable=SC2086
    check_cuda "$GRAPH" $c || fail=1
    # shellcheck disable=SC2086
    check_cuda "$GRAPH" $c --no-prune || fail=1
  done
  for s in B=1,H=1,T=16384,D=128 B=2,H=8,T=8291,D=64; do
    for np in "" "--no-prune"; do
      compare_runs fox "$s" "$FOXC" "$np" "$GRAPH" "$np" || fail=1
    done
  done
fi

echo "## (b) timings (tag,variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SMALL=${SMALL:-"B=1,H=1,T=16384,D=128 B=1,H=1,T=8192,D=128 B=1,H=2,T=16384,D=64 B=1,H=1,T=4096,D=128"}
  SHAPES=${SHAPES:-"B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SMALL; do
      for v in launches graph serial; do
        g=0; [ $v = graph ] && g=1
        ser=0; [ $v = serial ] && ser=1
        FOXC_CUDA_GRAPH=$g FOXC_SERIAL_LAUNCHES=$ser ITERS=${ITERS_SMALL:-200} bench_rows "small,$v,r$round" "$FOXC" "$s"
      done
    done
  done | tee "$OUT/graph_small.csv"
  for s in $SHAPES; do
    for v in launches graph; do
      g=0; [ $v = graph ] && g=1
      FOXC_CUDA_GRAPH=$g ITERS=${ITERS:-20} bench_rows "std,$v,r1" "$FOXC" "$s"
    done
  done | tee "$OUT/graph_std.csv"
fi

if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  s=${SMALL%% *}; s=${s:-B=1,H=1,T=16384,D=128}
  for np in "" "--no-prune"; do
    echo "## (c) ncu kernel durations: $s ${np:-pruned}"
    kernel_durations "$FOXC" "$s" . $np
  done
  echo "## (d) ncu: the attention kernel at ${NCU_SHAPE:=B=1,H=16,T=32768,D=128}"
  t 200 ncu -k regex:foxc_attn_fwd --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section SpeedOfLight \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$FOXC" run examples/fox.attn --backend cuda --shape "$NCU_SHAPE" --seed 0 >"$OUT/ncu_ws.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Achieved Occupancy|gmma_cycles|warps_active|pipe_xu|Registers Per|Shared Memory Config|Dynamic Shared|Duration|Stall|Issue Slots|Executed Ipc|No Eligible|Eligible Warps|Compute \(SM\)|Memory Throughput|L2 Cache Throughput|DRAM Throughput" "$OUT/ncu_ws.txt" | head -50
fi
[ $fail = 0 ] && echo "graph: all checks passed" || { echo "graph: FAILURES"; exit 1; }
