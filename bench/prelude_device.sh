#!/usr/bin/env bash
# Issue 11 item 3 (h7-prelude): the launches before the attention. The new build runs the gate
# scan beside the threshold kernels (two streams, fork/join on the plan's dependencies), the
# scan through shared memory with coalesced loads, the norms kernel with several rows in flight.
# FOXC_SERIAL_LAUNCHES=1 runs the same build's launches in plan order on one stream (the
# concurrency alone: new-serial vs new). Binaries (stripped, gzipped; carry both folders):
# FOXC_BASE (default .devbin/s4/foxc.gz) and FOXC_NEW (default .devbin/h7/foxc.gz: the base's
# commit plus h7's commits only, so the attention kernels are the base's).
# Steps, every command under `timeout`, everything into ONE log ($OUT/prelude.log):
#   (a) --check of the new build: fox (T = 777 / 4099, D = 64 / 128, pruned and --no-prune),
#       fox_alibi (Slope gates), fox_loggate, fox_gqa, fox at T = 9000 (two scan segments),
#       and `foxc grad --backend cuda --check` of fox (its plan forks too);
#   (b) same inputs: new vs base and new vs new-serial outputs (bitwise; the scan's c is
#       round_f32(exact cumsum) in both builds), at T up to 32768 (four scan segments);
#   (c) `foxc bench --iters 50` (pruned and dense rows) base, new, new-serial interleaved,
#       2 rounds, at SHAPES;
#   (d) ncu kernel durations of one new run (pruned, dense) at 1x1x16384x128 and of the
#       prelude kernels at 1x16x32768x128;
#   (e) (run after (b)) compute-sanitizer racecheck and memcheck of the scan at T = 9000,
#       memcheck of every kernel at T = 777.
# Knobs: CHECK=0 / CMP=0 / SAN=0 / TIME=0 / NCU=0 skip a step; ROUNDS, SHAPES, ITERS.
# Prints "prelude: all checks passed" or "prelude: FAILURES" last; exit 1 on a failed check.
# Usage (GPU machine, repository root): OUT=$OUT bash bench/prelude_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/prelude.log") 2>&1
unpack() { # a .gz is unpacked to a temporary folder; a plain binary is used as it is
  case "$1" in
    *.gz) local d; d=$(mktemp -d); gunzip -c "$1" >"$d/foxc" && chmod +x "$d/foxc" && echo "$d/foxc" ;;
    *) echo "$1" ;;
  esac
}
BASE=$(unpack "${FOXC_BASE:-.devbin/s4/foxc.gz}")
NEW=$(unpack "${FOXC_NEW:-.devbin/h7/foxc.gz}")
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0
t() { local s=$1; shift; timeout "$s" "$@"; }

echo "## (a) correctness of the new build: --backend cuda --check"
if [ "${CHECK:-1}" = 1 ]; then
  for c in "run fox B=1,H=2,T=777,D=64" "run fox B=1,H=2,T=777,D=128" "run fox B=1,H=1,T=4099,D=64" \
    "run fox B=1,H=1,T=4099,D=128" "run fox B=1,H=1,T=9000,D=64" "run fox_alibi B=1,H=4,T=1000,D=128" \
    "run fox_loggate B=1,H=2,T=1000,D=64" "run fox_gqa B=1,H=4,G=2,T=1000,D=128" \
    "grad fox B=1,H=2,T=777,D=64" "grad fox B=1,H=1,T=1000,D=128"; do
    set -- $c
    extras=("")
    [ "$1 $2" = "run fox" ] && extras=("" "--no-prune")
    for x in "${extras[@]}"; do
      out=$(t 60 "$NEW" "$1" "examples/$2.attn" --backend cuda --check --shape "$3" $x 2>&1); rc=$?
      echo "check $1 $2 [$3] ${x:-pruned} rc=$rc $(grep -iE 'check|error|rel' <<<"$out" | tail -3 | tr '\n' ' ')"
      [ $rc -eq 0 ] || { fail=1; echo "FAILED: check $1 $2 $3 $x"; }
    done
  done
fi

echo "## (b) same inputs: new vs base, new vs new-serial (bitwise)"
if [ "${CMP:-1}" = 1 ]; then
  for c in "fox B=1,H=2,T=32768,D=64 -" "fox B=1,H=1,T=16384,D=128 -" "fox B=1,H=1,T=16384,D=128 --no-prune" \
    "fox_loggate B=1,H=2,T=20000,D=64 -"; do
    set -- $c; x=$3; [ "$x" = - ] && x=""
    d=$(mktemp -d)
    t 60 "$BASE" inputs "examples/$1.attn" --shape "$2" --seed 3 -o "$d/in.safetensors" >/dev/null &&
      t 60 "$BASE" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/base.safetensors" >/dev/null &&
      t 60 "$NEW" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x -o "$d/new.safetensors" >/dev/null &&
      FOXC_SERIAL_LAUNCHES=1 t 60 "$NEW" run "examples/$1.attn" --backend cuda --inputs "$d/in.safetensors" $x \
        -o "$d/serial.safetensors" >/dev/null
    rc=$?
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: runs of $1 $2 $x rc=$rc"; rm -rf "$d"; continue; }
    for pair in "base new" "serial new"; do
      set -- $pair
      t 60 python3 - "$d" "$1" "$2" "$c" <<'EOF' || { fail=1; echo "FAILED: compare $pair $c"; }
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
d, x, y, what = sys.argv[1:5]
a = load(f"{d}/{x}.safetensors"); b = load(f"{d}/{y}.safetensors")
ok = set(a) == set(b)
for k in sorted(a):
    (dx, sx, bx), (dy, sy, by) = a[k], b[k]
    same = (dx, sx, bx) == (dy, sy, by)
    u, v = f64(dx, bx), f64(dy, by)
    rel = float(np.linalg.norm(u - v) / max(np.linalg.norm(u), 1e-30)) if u.shape == v.shape else float("nan")
    ndiff = int((u != v).sum()) if u.shape == v.shape else -1
    print(f"cmp {x} vs {y} [{what}] {k} {sy}: bitwise {'equal' if same else 'DIFFERENT'} "
          f"({ndiff} elements differ), rel L2 {rel:.3e}, nan {int(np.isnan(v).sum())}")
    # new vs serial: the same kernels, so bitwise. new vs base: bitwise expected when the two
    # builds differ only in the prelude (the scan rounds to round_f32(exact) in both); another
    # attention kernel may round bf16 outputs differently: rel L2 < 5e-3 (the (a) checks
    # against the f64 reference are the correctness gate).
    ok = ok and (same if x == "serial" else (rel < 5e-3 and not np.isnan(v).any()))
sys.exit(0 if ok else 1)
EOF
    done
    rm -rf "$d"
  done
fi

echo "## (e) compute-sanitizer: the scan and threshold kernels at T = 9000 (two scan segments)"
if [ "${SAN:-1}" = 1 ]; then
  for tool in racecheck memcheck; do
    log="$OUT/san_$tool.log"
    t 60 compute-sanitizer --tool "$tool" --error-exitcode 3 --kernel-name kns=gate_cumsum \
      "$NEW" run examples/fox.attn --backend cuda --shape B=1,H=2,T=9000,D=64 >"$log" 2>&1
    rc=$?
    echo "san $tool gate_cumsum rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
    [ $rc -eq 0 ] || { fail=1; echo "FAILED: $tool"; tail -8 "$log"; }
  done
  log="$OUT/san_memcheck_all.log"
  t 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$NEW" run examples/fox.attn --backend cuda \
    --shape B=1,H=2,T=777,D=64 >"$log" 2>&1
  rc=$?
  echo "san memcheck all kernels rc=$rc $(grep -E 'ERROR SUMMARY' "$log" | head -1)"
  [ $rc -eq 0 ] || { fail=1; echo "FAILED: memcheck all"; tail -8 "$log"; }
fi

echo "## (c) timings: foxc bench --iters ${ITERS:=50}, base / new / new-serial interleaved (variant,round,csv)"
if [ "${TIME:-1}" = 1 ]; then
  SHAPES=${SHAPES:-"B=1,H=1,T=16384,D=128 B=1,H=1,T=8192,D=128 B=1,H=2,T=16384,D=64 B=1,H=16,T=32768,D=128"}
  for round in $(seq "${ROUNDS:-2}"); do
    for s in $SHAPES; do
      for v in base new new-serial; do
        bin=$BASE; [ $v != base ] && bin=$NEW
        ser=0; [ $v = new-serial ] && ser=1
        # foxc bench times the pruned and the dense (--no-prune) program: two rows.
        FOXC_SERIAL_LAUNCHES=$ser t 60 "$bin" bench examples/fox.attn --backend cuda --shape "$s" --seed 0 \
          --iters "$ITERS" --format csv 2>&1 | grep -v '^program' | sed "s|^|$v,r$round,|"
      done
    done
  done | tee "$OUT/prelude_ab.csv"
fi

echo "## (d) ncu kernel durations (gpu__time_duration, us; ncu serializes the launches)"
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  for c in "B=1,H=1,T=16384,D=128 - ." "B=1,H=1,T=16384,D=128 --no-prune ." \
    "B=1,H=16,T=32768,D=128 - gate|threshold"; do
    set -- $c; x=$2; [ "$x" = - ] && x=""
    for v in base new; do
      bin=$BASE; [ $v = new ] && bin=$NEW
      echo "# ncu $v $1 ${x:-pruned}"
      t 60 ncu --clock-control none --metrics gpu__time_duration.sum -k "regex:$3" \
        "$bin" run examples/fox.attn --backend cuda --shape "$1" --seed 0 $x 2>&1 |
        grep -E "^\s+foxc_|gpu__time_duration" | paste - - | awk '{print $1, $(NF-1), $NF}'
    done
  done | tee "$OUT/prelude_ncu.txt"
fi
echo "prelude: $([ $fail -eq 0 ] && echo all checks passed || echo FAILURES) (${SECONDS}s)"
exit $fail
