#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, then every test of the
# workspace (unit and integration) with cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build (the crash tests run the cellmesh binary)"
cargo build --workspace --bins --locked
echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast "$@"
