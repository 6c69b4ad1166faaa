#!/usr/bin/env bash
# Assemble PTX files with ptxas for sm_90a and sm_80 and print each kernel's registers, shared
# memory, stack frame and spills (ptxas -v). Fails on the first assembly error.
#
#   scripts/ptxas_check.sh a.ptx [b.ptx ...]
#
# ptxas comes from $PTXAS, else .tools/nvcc/nvidia/cu13/bin/ptxas, else /tmp/nvcc/nvidia/cu13/bin/ptxas.
# A PTX whose `.target` is sm_90a is not assembled for sm_80 and the reverse (the .target
# line fixes the architecture); emit one PTX per target with `foxc compile --target`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  echo "usage: $0 FILE.ptx..." >&2
  exit 2
fi
PTXAS=${PTXAS:-}
if [ -z "$PTXAS" ]; then
  for c in .tools/nvcc/nvidia/cu13/bin/ptxas /tmp/nvcc/nvidia/cu13/bin/ptxas; do
    if [ -x "$c" ]; then PTXAS=$c; break; fi
  done
fi
if [ -z "$PTXAS" ] || [ ! -x "$PTXAS" ]; then
  echo "error: ptxas not found (set PTXAS=/path/to/ptxas)" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for ptx in "$@"; do
  target=$(sed -n 's/^\.target[[:space:]]*\([a-z0-9_]*\).*/\1/p' "$ptx" | head -1)
  case "$target" in
    sm_90a|sm_80) archs=$target ;;
    "") echo "FAIL: $ptx has no .target line"; exit 1 ;;
    *) echo "FAIL: $ptx targets $target (expected sm_90a or sm_80)"; exit 1 ;;
  esac
  for arch in $archs; do
    if ! "$PTXAS" -arch="$arch" -v "$ptx" -o "$tmp/a.cubin" >"$tmp/log" 2>&1; then
      echo "FAIL: ptxas -arch=$arch $ptx"
      cat "$tmp/log"
      exit 1
    fi
    echo "ok: $ptx ($arch)"
    # One line per kernel: name, registers, shared memory, stack, spills.
    awk '
      /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
      /bytes stack frame/ { sub(/^ptxas info *: */, ""); frame = $0 }
      /Used [0-9]+ registers/ { sub(/^ptxas info *: */, ""); printf "  %-60s %s | %s\n", name, $0, frame }
    ' "$tmp/log"
    n=$((n + 1))
  done
done
echo "ptxas: $n module(s) assembled"
