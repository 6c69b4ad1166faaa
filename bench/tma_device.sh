#!/usr/bin/env bash
# Issue 11 item 1 (h8-tma): K and V through the tensor memory accelerator in the warp-specialized
# forward (`--ws-loads tma`) against the cp.async producer (`--ws-loads cp-async`), ONE binary.
# Binary (built here from a clean tree, stripped, gzipped; carry its folder): FOXC_NEW (or FOXC;
# default .devbin/h8/foxc.gz). Budget: ~2 min.
# Steps, every command under `timeout`, everything into ONE log ($OUT/tma.log):
#   (0) the PTX really differs: `compile --emit ptx` has cp.async.bulk.tensor with tma only;
#   (a) `foxc run --backend cuda --check --ws-loads tma`: fox at T = 64, 130, 777, 8291, D = 128,
#       pruned (and --no-prune at 777 and 8291); fox_gqa, window, fox_keybias, fox_softcap at
#       D = 128. (D = 64 is
#       not reachable from the CLI: the tiles pass keeps D = 64 on the standard kernel.)
#   (b) tma vs cp-async on the same inputs: every output tensor bitwise equal (same arithmetic,
#       the same bytes in shared memory; rows past T are zeros instead of copies of row T - 1,
#       masked either way);
#   (c) compute-sanitizer memcheck and racecheck with tma on small D = 128 shapes;
#   (d) `foxc bench --iters 50` (pruned and dense rows) cp-async and tma interleaved, ROUNDS (2)
#       rounds, at SHAPES.
# Knobs: PTX=0 / CHECK=0 / CMP=0 / SAN=0 / TIME=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "tma: all checks passed" or "tma: FAILURES" last; exit 1 on any failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/tma_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/tma.log") 2>&1
unpack() { # a .gz is unpacked into a temporary folder; a plain binary is used as it is
  case "$1" in
    *.gz) local d; d=$(mktemp -d); gunzip -c "$1" >"$d/foxc" && chmod +x "$d/foxc" && echo "$d/foxc" ;;
    *) echo "$1" ;;
  esac
}
F=$(unpack "${FOXC_NEW:-${FOXC:-.devbin/h8/foxc.gz}}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
t() { local s=$1; shift; timeout "$s" "$@"; }

echo "## (0) the tma kernel is the one compiled"
if [ "${PTX:-1}" = 1 ]; then
  for l in tma cp-async; do
    n=$(t 60 "$F" compile examples/fox.attn --target sm_90a --shape D=128 --emit ptx --ws-loads $l |
      grep -c 'cp.async.bulk.tensor')
    echo "ptx --ws-loads $l: $n cp.async.bulk.tensor lines"
    { [ $l = tma ] && [ "$n" -gt 0 ]; } || { [ $l = cp-async ] && [ "$n" -eq 0 ]; } ||
      { fail=1; echo "FAILED: ptx $l"; }
  done
fi

echo "## (a) correctness with tma: --backend cuda --check --ws-loads tma"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=64,D=128" "fox B=1,H=2,T=130,D=128" "fox B=1,H=3,T=777,D=128" \
    "fox B=1,H=1,T=8291,D=128" "fox_gqa B=1,H=4,G=2,T=1000,D=128" "fox_softcap B=1,H=4,T=1000,D=128" \
    "window B=1,H=4,T=1000,D=128" "fox_keybias B=1,H=4,T=1000,D=128"; do
    set -- $c
    extras=("")
    case "$2" in *T=777,* | *T=8291,*) [ "$1" = fox ] && extras=("" "--no-prune") ;; esac
    for x in "${extras[@]}"; do
      out=$(t 90 "$F" run "examples/$1.attn" --backend cuda --check --ws-loads tma --shape "$2" $x 2>&1); rc=$?
      echo "check $1 [$2] ${x:-pruned} rc=$rc $(grep -E 'check|error' <<<"$out" | tr '\n' ' ')"
      [ $rc -eq 0 ] || { fail=1; echo "FAILED: check $1 $2 $x"; }
    done
  done
fi

echo "## (b) tma vs cp-async, same binary, same inputs: bitwise equal outputs"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=2,H=4,T=2051,D=128 -" "fox B=1,H=2,T=4099,D=128 --no-prune" "fox B=1,H=2,T=64,D=128 -" \
    "fox_gqa B=2,H=4,G=2,T=1000,D=128 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    d=$(mktemp -d)
    t 60 "$F" inputs "examples/$1.attn" --shape "$2" --seed 3 -o "$d/in.safetensors" >/dev/null &&
      t 60 "$F" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x --ws-loads cp-async \
        -o "$d/base.safetensors" >/dev/null &&
      t 60 "$F" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x --ws-loads tma \
        -o "$d/new.safetensors" >/dev/null
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

echo "## (c) compute-sanitizer with tma (warp-specialized kernel, D = 128)"
if [ "${SAN:-1}" = 1 ]; then
  for c in "memcheck fox B=1,H=2,T=300,D=128" "racecheck fox B=1,H=2,T=300,D=128"; do
    set -- $c
    log="$OUT/san_$1_$2_${3//[,=]/_}.log"
    t 60 compute-sanitizer --tool "$1" --error-exitcode 3 "$F" run "examples/$2.attn" --backend cuda \
      --ws-loads tma --shape "$3" >"$log" 2>&1
    rc=$?
    echo "san $1 $2 [$3] rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: $1 $2 $3"; tail -20 "$log"; }
  done
fi

echo "## (d) timings: foxc bench --iters ${ITERS:=50}, cp-async and tma interleaved (loads,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=4,H=16,T=8192,D=128 B=1,H=16,T=32768,D=128 B=1,H=1,T=16384,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for l in cp-async tma; do
        # foxc bench times the pruned and the dense (--no-prune) program: two rows.
        t 60 "$F" bench examples/fox.attn --backend cuda --shape "$s" --seed 0 --iters "$ITERS" \
          --ws-loads $l --format csv 2>&1 | grep -v '^program' | sed "s|^|$l,r$round,|"
      done
    done
  done | tee "$OUT/tma_ab.csv"
fi
echo "tma: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
