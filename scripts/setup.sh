#!/usr/bin/env bash
# Idempotent set-up of everything foxc needs on a fresh Debian 12 machine:
# LLVM 22 (linked statically into the foxc binary) and ptxas (to assemble generated PTX).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/lib/llvm-22/bin/llvm-config ] || need_apt+=(llvm-22-dev)
for p in libpolly-22-dev libzstd-dev zlib1g-dev libxml2-dev libffi-dev libz3-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# ptxas from the Python package nvidia-cuda-nvcc, into a local folder.
PTXAS=.tools/nvcc/nvidia/cu13/bin/ptxas
if [ ! -x "$PTXAS" ]; then
  echo "setup: installing ptxas (nvidia-cuda-nvcc==13.0.88) into .tools/nvcc"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target .tools/nvcc nvidia-cuda-nvcc==13.0.88
fi
"$PTXAS" --version | tail -n 1

# The Python package's build and test tools (maturin builds the wheel of python/; pytest runs
# python/tests; ml_dtypes lets them pass bfloat16 arrays) into a local folder: no virtual
# environment needed, and Debian's system Python refuses installs into itself (PEP 668).
PYTOOLS=.tools/py
if ! [ -x "$PYTOOLS/bin/maturin" ] || ! PYTHONPATH="$PYTOOLS" python3 -c "import pytest, numpy, ml_dtypes" 2>/dev/null; then
  echo "setup: installing maturin, pytest, numpy, ml_dtypes into $PYTOOLS"
  python3 -m pip install -q --disable-pip-version-check --upgrade --target "$PYTOOLS" \
    "maturin>=1.9.4,<2" pytest numpy ml_dtypes
fi

command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust (rustup) first" >&2; exit 1; }
