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
start_test_broker
trap '[ -z "${TEST_BROKER_PID:-}" ] || kill "$TEST_BROKER_PID" 2>/dev/null || true' EXIT
ignored=()
# Tests marked ignored need a real broker; run them when one is up.
[ -n "${CELLMESH_TEST_KAFKA_BROKERS:-}" ] && ignored=(--run-ignored all)
cargo nextest run --workspace --locked --no-fail-fast "${ignored[@]}" "$@"
