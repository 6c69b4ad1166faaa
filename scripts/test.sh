#!/usr/bin/env bash
# The test job: formatting, lints, every test, and every example's PTX through ptxas.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PTXAS="$PWD/.tools/nvcc/nvidia/cu13/bin/ptxas"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --workspace --quiet 2>&1 | tee target/test.log
echo "== ptxas: every example's PTX for sm_90a and sm_80"
scripts/ptxas_examples.sh
