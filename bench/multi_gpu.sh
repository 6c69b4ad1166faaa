#!/usr/bin/env bash
# The foxc torch op under torch.distributed: examples/train_fox.py (h7's training example) on
# 1 process, then under torchrun on 2 processes with --ddp and with --fsdp, same global batch and
# data; the per-step losses of the 2-process runs must follow the 1-process curve.
#
#   bench/multi_gpu.sh gpu   # 2 GPUs of one host (e.g. the nvidia-h200-x2 kind), NCCL
#   bench/multi_gpu.sh cpu   # CPU processes, gloo, --device cpu --methods reference: checks the
#                            # wrapping logic (the foxc op itself runs on CUDA tensors only)
#
# NCCL_NVLS_ENABLE=0: NVLink multicast (NVLS) stays off on the lent machines (KINDS.md).
# Env: PY (python, default python3), STEPS (default: the script's --quick), BATCH (global
# sequences per step, split over the ranks; default 2), TOL (largest allowed
# |loss_2proc - loss_1proc| per step; default 2e-2 on GPUs (bf16, another reduction order),
# 1e-4 on the CPU (f32)), EXTRA (more train_fox.py flags, e.g. --methods or the model size),
# OUT (folder for logs; default a new one under $TMPDIR).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-gpu}"
PY="${PY:-python3}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/foxc_multi_gpu.XXXXXX")}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

case "$mode" in
  gpu)
    dev=()
    TOL="${TOL:-2e-2}"
    n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    if [ "$n" -lt 2 ]; then echo "multi_gpu.sh: $n GPU(s) visible, 2 needed" >&2; exit 2; fi
    ;;
  cpu)
    dev=(--device cpu --methods reference)
    TOL="${TOL:-1e-4}"
    ;;
  *) echo "usage: bench/multi_gpu.sh gpu|cpu" >&2; exit 1 ;;
esac
steps=(--quick)
if [ -n "${STEPS:-}" ]; then steps+=(--steps "$STEPS"); fi
# shellcheck disable=SC2206
extra=(${EXTRA:-})
train=(examples/train_fox.py "${dev[@]}" "${steps[@]}" --batch "${BATCH:-2}" "${extra[@]}")

run() { # name, then the command
  local name=$1
  shift
  echo "== $name: $*"
  local t0=$SECONDS
  mkdir -p "$OUT/$name"
  if ! "$@" --loss-log "$OUT/$name.json" --out-dir "$OUT/$name" >"$OUT/$name.log" 2>&1; then
    tail -30 "$OUT/$name.log"
    echo "FAILED: $name (log: $OUT/$name.log)" >&2
    exit 1
  fi
  echo "   $((SECONDS - t0)) s"
}

run one "$PY" "${train[@]}"
torchrun=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2)
run ddp "${torchrun[@]}" "${train[@]}" --ddp
run fsdp "${torchrun[@]}" "${train[@]}" --fsdp

# train_fox.py --loss-log writes {method: [loss per step]} (rank 0).
"$PY" - "$OUT" "$TOL" <<'PYEOF'
import json, pathlib, sys
out, tol = pathlib.Path(sys.argv[1]), float(sys.argv[2])
logs = {n: json.loads((out / f"{n}.json").read_text()) for n in ("one", "ddp", "fsdp")}
bad = 0
for name in ("ddp", "fsdp"):
    for method, ref in logs["one"].items():
        got = logs[name].get(method, [])
        if len(got) != len(ref) or not ref:
            print(f"{name} {method}: {len(got)} steps logged, 1 process logged {len(ref)}")
            bad += 1
            continue
        diff = max(abs(a - b) for a, b in zip(ref, got))
        ok = diff <= tol
        bad += not ok
        print(f"{name} {method}: {len(got)} steps, loss {got[0]:.4f} -> {got[-1]:.4f} "
              f"(1 process {ref[0]:.4f} -> {ref[-1]:.4f}), max |diff| {diff:.2e} {'<=' if ok else '>'} {tol:g}")
print("multi_gpu:", "ok" if not bad else f"{bad} mismatch(es)")
sys.exit(1 if bad else 0)
PYEOF
