#!/usr/bin/env bash
# The GPU checks and rows of the inference features, in one device call:
#   checks  f16 (forward on each kernel, backward, an f16 output of bf16 operands), queries fewer
#           than keys forward and backward (prefill, decode, the mma.sync path at D = 96, f16),
#           long context against the f64 reference (decode and square at 131072 keys), given
#           per-head thresholds, packed sequences (CLI and Python), a cache keeping the decay
#           cumsum, and compute-sanitizer memcheck of the new kernels;
#   rows    (ROWS=1) f16 against bf16, forward and forward + backward, with SDPA and FlexAttention
#           + ACP in the same dtype in the same run; the prefill's fwd + bwd against the square
#           kernel's at the same keys (and FOXC_BASE's, interleaved, where given);
#   decode  (DECODE=1) checks of the split gate scan, split keys at several slice sizes and the
#           merge; a decode step against FOXC_BASE's (interleaved, the CLI's plan; SPLIT_TILES: the
#           slice sizes also timed); NCU=1: ncu of one step; bench/decode.py (the foxc wheel on
#           PYTHONPATH) with its peers (DECODE_PY=0: skipped).
# CHECKS: "all" (default), "0" (none) or the groups to run: f16 fq long given packed cache memcheck
#   (and split, the decode section's).
# Usage (GPU machine): FOXC=target/release/foxc[.gz] [FOXC_BASE=old/foxc[.gz]] [ROWS=0] [CHECKS=0]
#   [ROWS_F16=0] [DECODE=1] [NCU=1] [DECODE_PY=0] bench/inference_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
FOXC=$(unpack "${FOXC:-target/release/foxc}")
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
F16=bench/fox_f16.attn
PRE=bench/fox_prefill.attn
TMP=$(mktemp -d)
sed 's/bf16/f16/g' "$PRE" >"$TMP/prefill_f16.attn"
sed -e 's/q: f16/q: bf16/' -e 's/k: f16/k: bf16/' -e 's/v: f16/v: bf16/' "$F16" >"$TMP/mixed.attn"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fail=0

# chk run|grad FILE SHAPE [FLAGS...]: `--check` on the GPU, one summary line.
chk() {
  local what=$1 file=$2 shape=$3 out rc
  shift 3
  out=$(t 150 "$FOXC" "$what" "$file" --backend cuda --check --shape "$shape" --seed "${SEED:-7}" "$@" 2>&1)
  rc=$?
  echo "check $what $(basename "$file") [$shape] ${*:-pruned} rc=$rc $(grep -iE 'check|error|kept' <<<"$out" | tail -5 | tr '\n' ' ')"
  [ $rc -eq 0 ] || fail=1
}

# want GROUP: whether CHECKS (default "all"; "0": none) names the check group.
want() { case " ${CHECKS:-all} " in *" all "* | *" $1 "*) true ;; *) false ;; esac; }
if [ "${CHECKS:-all}" != 0 ]; then
  if want f16; then
  echo "## f16"
  for shape in B=2,H=4,T=2000,D=64 B=1,H=4,T=1777,D=128 B=1,H=3,T=999,D=96; do
    chk run $F16 $shape
    chk run $F16 $shape --no-prune
    chk run $F16 $shape --attn-kernel standard
    chk grad $F16 $shape
    chk grad $F16 $shape --no-prune
  done
  chk run $F16 B=1,H=4,T=2000,D=64 --attn-kernel warp-specialized
  chk run "$TMP/mixed.attn" B=1,H=2,T=1000,D=128
  fi
  if want fq; then
  echo "## queries fewer than keys, forward and backward"
  for shape in B=1,H=4,N=300,M=1000,D=64 B=2,H=2,N=1,M=777,D=128 B=1,H=2,N=64,M=2049,D=64 \
    B=1,H=3,N=130,M=3000,D=96 B=1,H=2,N=1000,M=1000,D=128 B=1,H=4,N=700,M=5000,D=128; do
    chk run $PRE $shape
    chk grad $PRE $shape
    chk grad $PRE $shape --no-prune
  done
  chk grad "$TMP/prefill_f16.attn" B=1,H=4,N=300,M=1000,D=64
  chk grad "$TMP/prefill_f16.attn" B=1,H=2,N=1,M=3000,D=128
  echo "## more than 64 queries on the warp-specialized kernel: its loads, grids, turns, D = 64"
  for flags in "--ws-loads cp-async" "--ws-grid persistent" "--ws-turns none" "--attn-kernel standard" \
    "--ws-grid persistent --ws-loads cp-async" "--no-prune"; do
    # shellcheck disable=SC2086
    chk run $PRE B=1,H=4,N=700,M=5000,D=128 $flags
  done
  chk run $PRE B=2,H=2,N=65,M=4097,D=128
  chk run $PRE B=1,H=2,N=4096,M=16384,D=128
  chk run "$TMP/prefill_f16.attn" B=1,H=2,N=1000,M=7000,D=128
  chk run $PRE B=1,H=4,N=300,M=1000,D=64 --attn-kernel warp-specialized
  chk run $PRE B=1,H=4,N=1000,M=3001,D=64 --attn-kernel warp-specialized --tiles 64x128
  fi
  if want long; then
  echo "## long context against the f64 reference"
  chk run $PRE B=1,H=16,N=1,M=131072,D=128
  chk run $PRE B=1,H=16,N=1,M=131072,D=128 --no-prune
  chk run examples/fox.attn B=1,H=8,T=131072,D=128
  fi
  if want given; then
  echo "## per-head thresholds given by the user (--thresholds; docs/RULES.md, Given thresholds)"
  # Mild thresholds (the pruned mass stays below eps on the standard workload, so --check's
  # ACP criterion holds), one head never pruned; the in-kernel starts against the reference's.
  chk run examples/fox.attn B=1,H=4,T=2000,D=64 --thresholds=-30,-20,-inf,-40
  chk run examples/fox.attn B=2,H=4,T=3000,D=128 --thresholds=-30,-20,-inf,-40 --check-starts
  chk run examples/fox.attn B=1,H=4,T=2000,D=64 --thresholds=-30,-20,-inf,-40 --attn-kernel standard --check-starts
  chk run $PRE B=1,H=4,N=300,M=1000,D=64 --thresholds=-30,-20,-inf,-40
  chk grad examples/fox.attn B=1,H=4,T=1000,D=64 --thresholds=-30,-20,-inf,-40
  chk grad $PRE B=1,H=2,N=130,M=1000,D=64 --thresholds=-25,-inf
  # Another head count than thresholds: a user error (exit 1) before any launch.
  out=$(t 60 "$FOXC" run examples/fox.attn --backend cuda --shape B=1,H=3,T=256,D=64 --thresholds=-8,-9 2>&1)
  rc=$?
  echo "check run fox.attn H=3 with 2 thresholds rc=$rc (want 1) $(grep -i error <<<"$out" | head -1)"
  [ $rc -eq 1 ] || fail=1
  fi
  if want packed; then
  echo "## packed sequences (per-token first keys, as foxc.fox.program(head_first=False, packed=True))"
  cat >"$TMP/packed.attn" <<'EOF'
attention packed(q: bf16[B, T, H, D], k: bf16[B, T, H, D], v: bf16[B, T, H, D], fgate: f32[B, T, H], first: i32[B, T] in [0, 1500]) -> bf16[B, T, H, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, t, h]))
    s[b, h, i, j]   = sum(d, q[b, i, h, d] * k[b, j, h, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, select(j >= first[b, i], s[b, h, i, j], -inf)))
    out[b, i, h, d] = sum(j, p[b, h, i, j] * v[b, j, h, d])
    return out
}
EOF
  chk run "$TMP/packed.attn" B=1,T=3000,H=4,D=64
  chk run "$TMP/packed.attn" B=1,T=3000,H=4,D=128 --no-prune
  chk grad "$TMP/packed.attn" B=1,T=1000,H=2,D=64
  # The key bound in the backward (dq's start, dkv's chunk skip; dense too) and the
  # warp-specialized forward's consumers (D = 128 on sm_90a), each of its variants.
  chk grad "$TMP/packed.attn" B=2,T=700,H=4,D=128
  chk grad "$TMP/packed.attn" B=2,T=700,H=4,D=128 --no-prune
  chk grad "$TMP/packed.attn" B=1,T=500,H=3,D=96
  for fl in "--ws-grid persistent" "--ws-loads cp-async" "--ws-turns none" "--tiles 128x128"; do
    chk run "$TMP/packed.attn" B=2,T=700,H=4,D=128 $fl
  done
  echo "## Python on CUDA: foxc.load(thresholds=...) and foxc.fox.attention(cu_seqlens=...)"
  t 600 python3 bench/varlen_thresholds_gpu.py 2>&1 | tee "$OUT/varlen_thresholds_gpu.log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  fi
  if want cache; then
  echo "## a decode step against a cache that keeps the decay cumsum (examples/fox_cache.attn)"
  CACHE=examples/fox_cache.attn
  chk run $CACHE B=1,H=16,N=1,M=20000,D=128
  chk run $CACHE B=2,H=4,N=3,M=5000,D=64 --no-prune
  chk run $CACHE B=1,H=2,N=64,M=9000,D=128
  chk run $CACHE B=1,H=2,N=300,M=1000,D=64
  chk grad $CACHE B=1,H=2,N=1,M=3000,D=64
  chk grad $CACHE B=1,H=2,N=100,M=700,D=128
  fi
  if want memcheck; then
  echo "## compute-sanitizer memcheck"
  for args in "run examples/fox_cache.attn --shape B=1,H=2,N=2,M=3000,D=128" \
    "grad $PRE --shape B=1,H=2,N=100,M=700,D=64" "grad $PRE --shape B=1,H=2,N=1,M=333,D=128" \
    "run $F16 --shape B=1,H=2,T=300,D=128" "grad $F16 --shape B=1,H=2,T=300,D=64" \
    "run $PRE --shape B=1,H=2,N=300,M=1000,D=128" "run $PRE --shape B=1,H=2,N=300,M=1000,D=128 --ws-loads cp-async --ws-grid persistent"; do
    log="$OUT/memcheck_$(tr ' =,/' '____' <<<"$args").log"
    # shellcheck disable=SC2086
    t 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$FOXC" $args --backend cuda >"$log" 2>&1
    rc=$?
    echo "memcheck [$args] rc=$rc $(grep -E 'ERROR SUMMARY' "$log" | head -1)"
    [ $rc -eq 0 ] || { fail=1; tail -15 "$log"; }
  done
  fi
  echo "checks: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
fi

if [ "${ROWS:-1}" = 1 ]; then
  if [ "${ROWS_F16:-1}" = 1 ]; then
    echo "## rows: f16 against bf16, peers in the same dtype (ms; foxc bench median of 50)"
    shape=B=2,H=16,T=16384,D=128
    "$FOXC" inputs examples/fox.attn --shape $shape --seed 0 -o "$TMP/in_bf16.safetensors" >/dev/null
    "$FOXC" inputs $F16 --shape $shape --seed 0 -o "$TMP/in_f16.safetensors" >/dev/null
    for f in examples/fox.attn $F16; do
      t 200 "$FOXC" bench $f --backend cuda --shape $shape --seed 0 --iters 50 --format csv 2>&1 | sed "s|^|$(basename $f),|"
      t 200 "$FOXC" bench $f --backend cuda --shape B=1,H=16,T=8192,D=128 --seed 0 --iters 20 --grad --format csv 2>&1 |
        sed "s|^|$(basename $f),grad,|"
    done | tee "$OUT/f16_foxc.csv"
    for dt in bf16 f16; do
      t 300 python3 bench/peers.py "$TMP/in_$dt.safetensors" --no-dense-flex 2>&1 | sed "s|^|$dt,|"
    done | tee "$OUT/f16_peers.csv"
  fi
  echo "## rows: prefill N = 4096 of M = 16384 against the square T = 16384, forward and fwd + bwd"
  # With FOXC_BASE: its prefill rows too, interleaved with this binary's, twice.
  BASE=${FOXC_BASE:+$(unpack "$FOXC_BASE")}
  for rep in 1 2; do
    for args in "$PRE --shape B=1,H=16,N=4096,M=16384,D=128" "examples/fox.attn --shape B=1,H=16,T=16384,D=128"; do
      for g in "" --grad; do
        for v in ${BASE:+base} new; do
          bin=$FOXC
          [ $v = base ] && bin=$BASE
          # shellcheck disable=SC2086
          t 200 "$bin" bench $args --backend cuda --seed 0 --iters 20 $g --format csv 2>&1 |
            grep -v '^program' | sed "s|^|$v,rep$rep,${g:-fwd},|"
        done
      done
    done
  done | tee "$OUT/prefill_rows.csv"
fi
if [ "${DECODE:-0}" = 1 ]; then
  if want split; then
  echo "## decode: the split gate scan (M > 8192), split keys at several slice sizes and the merge"
  for tiles in 1 4 16 64; do
    chk run $PRE B=1,H=16,N=1,M=20000,D=128 --split-key-tiles $tiles
  done
  chk run $PRE B=2,H=4,N=3,M=40000,D=64 --no-prune --split-key-tiles 2
  chk run $PRE B=1,H=2,N=64,M=9000,D=128 --split-key-tiles 1
  chk run $PRE B=2,H=3,N=1,M=1,D=64
  chk run $PRE B=1,H=2,N=5,M=300,D=96 --split-key-tiles 1
  chk run "$TMP/prefill_f16.attn" B=1,H=4,N=2,M=5000,D=128 --split-key-tiles 4
  chk grad $PRE B=1,H=2,N=1,M=20000,D=64
  log="$OUT/memcheck_split.log"
  t 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$FOXC" run $PRE --backend cuda \
    --shape B=1,H=2,N=3,M=20000,D=128 --split-key-tiles 1 >"$log" 2>&1
  rc=$?
  echo "memcheck [split scan and merge, M = 20000, 157 planes] rc=$rc $(grep -E 'ERROR SUMMARY' "$log" | head -1)"
  [ $rc -eq 0 ] || fail=1
  fi
  if [ -n "${FOXC_BASE:-}" ]; then
    BASE=$(unpack "$FOXC_BASE")
    echo "## decode step, this binary (split keys: default, ${SPLIT_TILES:-4 8 32} tiles) against FOXC_BASE, interleaved; ms, median of 50"
    for shape in ${DECODE_SHAPES:-B=1,H=16,N=1,M=131072,D=128 B=8,H=16,N=1,M=131072,D=128}; do
      for rep in 1 2; do
        for v in base new ${SPLIT_TILES:-4 8 32}; do
          case $v in
            base) bin=$BASE flags="" ;;
            new) bin=$FOXC flags="" ;;
            *) bin=$FOXC flags="--split-key-tiles $v" ;;
          esac
          # shellcheck disable=SC2086
          t 120 "$bin" bench $PRE --backend cuda --shape $shape --seed 0 --iters 50 --format csv $flags 2>&1 |
            grep -v '^program' | sed "s|^|$v,rep$rep,|"
        done
      done
    done | tee "$OUT/decode_ab.csv"
  fi
  if [ "${NCU:-0}" = 1 ]; then
    echo "## ncu: every kernel of one decode step (B = 8, M = 131072), then the attention kernel in depth"
    shape=B=8,H=16,N=1,M=131072,D=128
    FOXC_CUDA_GRAPH=0 t 200 ncu --section SpeedOfLight -k regex:foxc -c 8 "$FOXC" run $PRE --backend cuda \
      --shape $shape >"$OUT/ncu_step.txt" 2>&1
    grep -E "foxc_|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)" "$OUT/ncu_step.txt" | head -60
    FOXC_CUDA_GRAPH=0 t 200 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section LaunchStats --section SchedulerStats -k regex:attn_fwd -c 1 "$FOXC" run $PRE \
      --backend cuda --shape $shape >"$OUT/ncu_attn.txt" 2>&1
    grep -vE "^==PROF==|^ *-+ *$" "$OUT/ncu_attn.txt" | tail -90
  fi
  if [ "${DECODE_PY:-1}" = 1 ]; then
    echo "## bench/decode.py (peers in the same run)"
    # shellcheck disable=SC2086
    t "${DECODE_S:-420}" python3 bench/decode.py ${DECODE_ARGS:---M 32768 131072 --B 1 8} --json "$OUT/decode.json" 2>&1 |
      tee "$OUT/decode.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
  fi
fi
exit $fail
