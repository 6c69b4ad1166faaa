#!/usr/bin/env bash
# Issue 11, run 10 (h6-prologue, docs/GPU_KERNEL.md "Run 10"): the warp-specialized forward's
# fixed cost per block (start search overlapped with the first loads, split over the warps;
# bf16 output through shared memory) against the build before it, on the same card in one call.
# Binaries (built here, stripped, gzipped; carry both folders): FOXC_BASE (default
# .devbin/s4/foxc.gz, main at 416de6e) and FOXC_NEW (default .devbin/h6/foxc.gz).
# Steps, every command under `timeout`, everything into ONE log ($OUT/ws10.log):
#   (a) `foxc run --backend cuda --check` of the new build (fox at T = 64, 130, 777, 8291,
#       D = 128, default and --no-prune; fox_gqa, fox_softcap, window, fox_keybias at D = 128);
#   (b) new vs base on the same inputs: every output tensor bitwise equal (same arithmetic);
#   (c) compute-sanitizer memcheck and racecheck of the new build on small D = 128 shapes;
#   (d) `foxc bench --iters 50` (pruned and dense rows) base and new interleaved, ROUNDS (2)
#       rounds, at SHAPES.
# Knobs: CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; ROUNDS, SHAPES, ITERS; NCU=1 adds ncu
# sections of one new attention launch at NCU_SHAPE (default 1x16x32768x128).
# Prints "ws10: all checks passed" or "ws10: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/ws10_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/ws10.log") 2>&1
unpack() { # a .gz is unpacked next to /tmp; a plain binary is used as it is
  case "$1" in
    *.gz) local d; d=$(mktemp -d); gunzip -c "$1" >"$d/foxc" && chmod +x "$d/foxc" && echo "$d/foxc" ;;
    *) echo "$1" ;;
  esac
}
BASE=$(unpack "${FOXC_BASE:-.devbin/s4/foxc.gz}")
NEW=$(unpack "${FOXC_NEW:-.devbin/h6/foxc.gz}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
t() { local s=$1; shift; timeout "$s" "$@"; }

echo "## (a) correctness of the new build: --backend cuda --check"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=64,D=128" "fox B=1,H=2,T=130,D=128" "fox B=1,H=3,T=777,D=128" \
    "fox B=1,H=1,T=8291,D=128" "fox_gqa B=1,H=4,G=2,T=1000,D=128" "fox_softcap B=1,H=4,T=1000,D=128" \
    "window B=1,H=4,T=1000,D=128" "fox_keybias B=1,H=4,T=1000,D=128"; do
    set -- $c
    extras=("")
    [ "$1" = fox ] && extras=("" "--no-prune")
    for x in "${extras[@]}"; do
      out=$(t 90 "$NEW" run "examples/$1.attn" --backend cuda --check --shape "$2" $x 2>&1); rc=$?
      echo "check $1 [$2] ${x:-pruned} rc=$rc $(grep -E 'check|error' <<<"$out" | tr '\n' ' ')"
      [ $rc -eq 0 ] || { fail=1; echo "FAILED: check $1 $2 $x"; }
    done
  done
fi

echo "## (b) new vs base, same inputs: bitwise equal outputs"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=2,H=4,T=2051,D=128 -" "fox B=1,H=2,T=8291,D=128 -" "fox B=1,H=2,T=4099,D=128 --no-prune" \
    "fox_keybias B=1,H=4,T=1000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    d=$(mktemp -d)
    t 60 "$BASE" inputs "examples/$1.attn" --shape "$2" --seed 3 -o "$d/in.safetensors" >/dev/null &&
      t 60 "$BASE" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/base.safetensors" >/dev/null &&
      t 60 "$NEW" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/new.safetensors" >/dev/null
    rc=$?
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: runs of $1 $2 $x rc=$rc"; continue; }
    t 60 python3 - "$d" "$1 [$2] ${x:-pruned}" <<'EOF' || { fail=1; echo "FAILED: compare $1 $2 $x"; }
import json, struct, sys
import numpy as np
def load(path):  # safetensors by hand: {name: (dtype, shape, raw bytes)}
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); body = raw[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
def f64(dt, b):
    if dt == "BF16":
        return (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(b, {"F32": np.float32, "F16": np.float16, "I32": np.int32}[dt]).astype(np.float64)
a = load(f"{sys.argv[1]}/base.safetensors"); b = load(f"{sys.argv[1]}/new.safetensors")
ok = set(a) == set(b)
for k in sorted(a):
    (dx, sx, bx), (dy, sy, by) = a[k], b[k]
    same = (dx, sx, bx) == (dy, sy, by)
    x, y = f64(dx, bx), f64(dy, by)
    rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)) if x.shape == y.shape else float("nan")
    print(f"cmp {sys.argv[2]} {k} {sy} {dy}: bitwise {'equal' if same else 'DIFFERENT'}, "
          f"rel L2 {rel:.3e}, nan {int(np.isnan(y).sum())}")
    ok = ok and same
sys.exit(0 if ok else 1)
EOF
    rm -rf "$d"
  done
fi

echo "## (c) compute-sanitizer on the new build (warp-specialized kernel, D = 128)"
if [ "${SAN:-1}" = 1 ]; then
  for c in "memcheck B=1,H=2,T=300,D=128" "racecheck B=1,H=2,T=300,D=128"; do
    set -- $c
    log="$OUT/san_$1_${2//[,=]/_}.log"
    t 100 compute-sanitizer --tool "$1" --error-exitcode 3 "$NEW" run examples/fox.attn --backend cuda --shape "$2" >"$log" 2>&1
    rc=$?
    echo "san $1 [$2] rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: $1 $2"; tail -20 "$log"; }
  done
fi

echo "## (d) timings: foxc bench --iters ${ITERS:=50}, base and new interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128 B=1,H=1,T=16384,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for v in base new; do
        bin=$BASE; [ $v = new ] && bin=$NEW
        # foxc bench times the pruned and the dense (--no-prune) program: two rows.
        t 60 "$bin" bench examples/fox.attn --backend cuda --shape "$s" --seed 0 --iters "$ITERS" \
          --format csv 2>&1 | grep -v '^program' | sed "s|^|$v,r$round,|"
      done
    done
  done | tee "$OUT/ws10_ab.csv"
fi
# NCU=1: ncu sections of one new attention launch at NCU_SHAPE (off by default: ~1-2 min).
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "## ncu: the new build's attention kernel at ${NCU_SHAPE:=B=1,H=16,T=32768,D=128}"
  t 200 ncu -k regex:foxc_attn_fwd --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$NEW" run examples/fox.attn --backend cuda --shape "$NCU_SHAPE" --seed 0 >"$OUT/ncu_new.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Achieved Occupancy|cycles_active|warps_active|time_duration|Registers Per|Stall|stall|Issue Slots|No Eligible|Eligible Warps" "$OUT/ncu_new.txt" | head -30
fi
echo "ws10: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
