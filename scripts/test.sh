#!/usr/bin/env bash
# The test job: formatting, lints, every test, and every example's PTX through ptxas.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PTXAS="$PWD/.tools/nvcc/nvidia/cu13/bin/ptxas"
# The ptxas tests fail rather than skip here (codegen/src/nvptx/ptxas.rs).
export FOXC_REQUIRE_PTXAS=1

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
export FOXC_SKIP_LOG="$PWD/target/skipped.log"
rm -f "$FOXC_SKIP_LOG"
cargo test --workspace --quiet 2>&1 | tee target/test.log
echo "== skipped tests (GPU tests without a GPU)"
sort "$FOXC_SKIP_LOG" 2>/dev/null | uniq -c || true
echo "  $(sort -u "$FOXC_SKIP_LOG" 2>/dev/null | wc -l) test(s) skipped"
echo "== bench/abuse.sh: malformed and extreme inputs give exit 0 or 1, in bounded time and memory"
bench/abuse.sh target/debug/foxc
echo "== python: fmt, clippy, the wheel (built once), pytest"
# python/ is its own Cargo workspace (see python/Cargo.toml); it shares the target dir with the
# root, and its test profile compiles the foxc crates as `cargo test` just did: only pyo3 and the
# extension itself are new work.
TGT="${CARGO_TARGET_DIR:-$PWD/target}"
CARGO_TARGET_DIR="$TGT" cargo fmt --manifest-path python/Cargo.toml -- --check
CARGO_TARGET_DIR="$TGT" cargo clippy --manifest-path python/Cargo.toml --all-targets --quiet -- -D warnings
rm -rf "$TGT/wheels" "$TGT/pyfoxc"
t0=$SECONDS
CARGO_TARGET_DIR="$TGT" .tools/py/bin/maturin build --quiet --profile dev -m python/Cargo.toml -o "$TGT/wheels"
echo "python: wheel built in $((SECONDS - t0)) s: $(ls "$TGT/wheels")"
python3 -m pip install -q --disable-pip-version-check --no-deps --target "$TGT/pyfoxc" "$TGT"/wheels/foxc-*.whl
# From the repository root (python/foxc, the uninstalled source, must not shadow the wheel).
PYTHONPATH="$TGT/pyfoxc:$PWD/.tools/py" python3 -m pytest -q -p no:cacheprovider python/tests
echo "== ptxas: every example's PTX for sm_90a and sm_80"
scripts/ptxas_examples.sh
