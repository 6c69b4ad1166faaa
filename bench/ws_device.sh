#!/usr/bin/env bash
# Issue 11's device call: the warp-specialized sm_90a forward against the standard kernel on the
# same card in one call. Binaries (stripped, gzipped as .devbin/h5/foxc-<name>.gz, carried):
# foxc-base (built with the tiles pass never choosing the new kernel: `let ws = false && ...` in
# passes/src/tiles.rs::kernel_for) and the builds to compare, named by WS. In run 8
# (docs/GPU_KERNEL.md) they were a (serial consumers), b (softmax overlapped with P V inside each
# consumer) and c (b with pingpong; the committed code).
# Order: correctness (--check against the f64 reference; new vs base on the same inputs),
# compute-sanitizer memcheck and racecheck on small cases, then interleaved timings.
# Every command has a timeout: a kernel that deadlocks on its barriers must not eat the lease.
# Knobs: WS, CASES (example shape pairs), FULL=1 (every fox case also --no-prune and two
# --tiles), CMP (shapes of the new-vs-base comparison), SAN_SHAPE, SHAPES (timed shapes), TIME_WS
# (builds timed, default WS), TILES (extra --tiles for the timed runs of the WS builds).
# BIN (default .devbin/h5) is the folder of the binaries; ROUNDS (default 1) repeats the timed
# loop, so base and new alternate several times; NCU=1 profiles the first WS build's attention
# kernel once at NCU_SHAPE (achieved occupancy, tensor pipe, stall reasons) when ncu is there.
# SAN_WS: the builds the sanitizer runs (default WS).
# CHECK=0 / SAN=0 / TIME=0 skip the correctness (--check and new vs base), sanitizer, timing steps.
# Usage on the GPU machine: WS=c bench/ws_device.sh   (run 8, call 2: see docs/GPU_KERNEL.md)
# Run 9 (persistent grid, h2-hopper): BIN=.devbin/h2 WS=new FULL=0 ROUNDS=2 NCU=1 with the
# CASES / CMP / SAN_SHAPE / SHAPES given in docs/GPU_KERNEL.md, run 9.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${BIN:-.devbin/h5}
for f in "$BIN"/*.gz; do gunzip -kf "$f" && chmod +x "${f%.gz}"; done
BASE=$BIN/foxc-base
WS=${WS:-c}
CASES=${CASES:-"fox:B=1,H=3,T=777,D=128 fox:B=1,H=3,T=777,D=64 fox:B=1,H=2,T=64,D=64 fox:B=1,H=2,T=130,D=128
  fox_softcap:B=1,H=4,T=1000,D=128 fox_gqa:B=1,H=4,G=2,T=1000,D=64 window:B=1,H=4,T=1000,D=128
  fox_keybias:B=1,H=4,T=1000,D=64"}
SHAPES=${SHAPES:-"B=1,H=16,T=32768,D=128 B=4,H=16,T=8192,D=128 B=8,H=16,T=4096,D=128 B=1,H=16,T=32768,D=64
  B=1,H=1,T=16384,D=128"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
t() { timeout "${TMO:-60}" "$@"; }

echo "## correctness: --backend cuda --check"
[ "${CHECK:-1}" = 1 ] && for v in $WS; do
  for c in $CASES; do
    ex=${c%%:*}; shape=${c#*:}; extra1=""
    # ex:shape:flags (flags with + for spaces, e.g. fox:B=1,H=1,T=4099,D=128:--no-prune)
    case "$shape" in *:*) extra1=${shape#*:}; extra1=${extra1//+/ }; shape=${shape%%:*} ;; esac
    extras=("$extra1")
    [ "$ex" = fox ] && [ "${FULL:-1}" = 1 ] && extras=("" "--no-prune" "--tiles 128x64" "--tiles 64x128")
    for extra in "${extras[@]}"; do
      line=$(t $BIN/foxc-$v run "examples/$ex.attn" --backend cuda --check --shape "$shape" $extra 2>&1 |
        grep -E "check|error" | tr '\n' ' ')
      rc=${PIPESTATUS[0]}
      echo "$v $ex [$shape] $extra rc=$rc $line"
      # A variant the GPU backend refuses ("cannot yet run") is not this kernel's failure.
      [ "$rc" -eq 0 ] || case "$line" in *"cannot yet"*) ;; *) fail=1 ;; esac
    done
  done
done

echo "## new vs base on the same inputs (rel L2 and max |diff| of every output tensor)"
[ "${CHECK:-1}" = 1 ] && for s in ${CMP:-"B=2,H=4,T=2051,D=128"}; do
  t "$BASE" inputs examples/fox.attn --shape "$s" --seed 3 -o /tmp/ws_in.safetensors >/dev/null || fail=1
  t "$BASE" run examples/fox.attn --backend cuda --inputs /tmp/ws_in.safetensors -o /tmp/ws_base.safetensors >/dev/null 2>&1 || fail=1
  for v in $WS; do
    t $BIN/foxc-$v run examples/fox.attn --backend cuda --inputs /tmp/ws_in.safetensors -o /tmp/ws_$v.safetensors >/dev/null 2>&1 || fail=1
    python3 - "$s" "$v" <<'EOF' || fail=1
import sys
from safetensors.torch import load_file
a = load_file("/tmp/ws_base.safetensors"); b = load_file(f"/tmp/ws_{sys.argv[2]}.safetensors")
ok = True
for k in a:
    x = a[k].double(); y = b[k].double()
    rel = float((x - y).norm() / x.norm().clamp_min(1e-30))
    print(f"{sys.argv[2]} {sys.argv[1]} {k}: rel L2 vs base {rel:.3e}, max |diff| {float((x - y).abs().max()):.3e}, nan {int(y.isnan().sum())}")
    ok = ok and rel <= 1e-2
sys.exit(0 if ok else 1)
EOF
  done
done

echo "## compute-sanitizer (small cases)"
[ "${SAN:-1}" = 1 ] && for v in ${SAN_WS:-$WS}; do
  for tool in memcheck racecheck; do
    s=${SAN_SHAPE:-"B=1,H=2,T=300,D=64"}; [ $tool = racecheck ] && s=${SAN_SHAPE:-"B=1,H=1,T=260,D=128"}
    log="$OUT/san_${v}_$tool.log"
    TMO=240 t compute-sanitizer --tool $tool --error-exitcode 3 $BIN/foxc-$v run examples/fox.attn --backend cuda --shape "$s" >"$log" 2>&1
    rc=$?
    echo "$v $tool [$s] rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [ "$rc" -eq 0 ] || fail=1
  done
done

echo "## timings (variant, then foxc bench's csv: pruned and dense rows)"
[ "${TIME:-1}" = 1 ] && for round in $(seq "${ROUNDS:-1}"); do
for shape in $SHAPES; do
  for v in base ${TIME_WS:-$WS}; do
    for tl in "" ${TILES:-}; do
      [ "$v" = base ] && [ -n "$tl" ] && continue
      t $BIN/foxc-$v bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters ${ITERS:-20} \
        --format csv ${tl:+--tiles $tl} 2>&1 | grep -v '^program' | sed "s|^|$v${tl:+ tiles $tl},|"
    done
  done
done
done | tee "$OUT/ws_ab.csv"

# NCU_BEFORE: skip the profile when the script has already run that many seconds (lease).
if [ "${NCU:-0}" = 1 ] && [ "$SECONDS" -lt "${NCU_BEFORE:-100000}" ] && command -v ncu >/dev/null; then
  v=${WS%% *}
  echo "## ncu: $v, one attention launch at ${NCU_SHAPE:=B=1,H=16,T=32768,D=128}"
  TMO=${NCU_TMO:-150} t ncu -k regex:foxc_attn_fwd --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$BIN/foxc-$v" run examples/fox.attn --backend cuda --shape "$NCU_SHAPE" >"$OUT/ncu_$v.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Achieved Occupancy|hmma_cycles_active|warps_active|Registers Per|Duration|Stall|stall|Issue Slots|Executed Ipc" "$OUT/ncu_$v.txt" | head -30
fi
echo "correctness and sanitizer: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
exit $fail
