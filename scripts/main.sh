#!/usr/bin/env bash
# The main job: FoX on the CPU backend over the embedded standard workload
# (B=1, H=8, T=4096, D=64), with ACP, checked against the f64 reference on sampled rows.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
cargo build --release --quiet --bin foxc
exec target/release/foxc run --check "$@"
