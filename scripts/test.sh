#!/usr/bin/env bash
# The whole test suite: set-up, formatting, lints, every test of the
# workspace (unit and integration) with cargo-nextest, the Terraform
# checks (scripts/test-terraform.sh), then short chaos drills against a
# `cellmesh dev` deployment (skip them with CELLMESH_SKIP_DRILL=1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== crate graph: only the router replicas build Raft"
for crate in cellmesh-cell cellmesh-control-plane cellmesh-edge cellmesh-route-client cellmesh-coord cellmesh-operations; do
  if cargo tree -p "$crate" -e normal --locked | grep -q openraft; then
    echo "$crate depends on openraft; the route client, coordination and operations crates are what it may use"
    exit 1
  fi
done
echo "== no new function over 120 lines (scripts/long-functions.allow lists the old ones)"
python3 scripts/long-functions.py
echo "== no new test function over 110 lines (scripts/long-tests.allow lists the old ones)"
python3 scripts/long-functions.py --tests --limit 110 --allow scripts/long-tests.allow
echo "== the previous release's binary (the mixed-version test runs it beside this one)"
CELLMESH_PREVIOUS_BIN=$(scripts/build-previous.sh)
export CELLMESH_PREVIOUS_BIN
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build (the crash tests run the cellmesh binary)"
# The previous release's build left its binary on the same path.
rm -f "$CARGO_TARGET_DIR/debug/cellmesh"
cargo build --workspace --bins --locked
"$CARGO_TARGET_DIR/debug/cellmesh" --version | grep -qx "cellmesh $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)" ||
  { echo "the built binary is not this tree's release"; exit 1; }
echo "== tests"
start_test_broker
trap '[ -z "${TEST_BROKER_PID:-}" ] || kill "$TEST_BROKER_PID" 2>/dev/null || true' EXIT
ignored=()
# Tests marked ignored need a real broker; run them when one is up.
[ -n "${CELLMESH_TEST_KAFKA_BROKERS:-}" ] && ignored=(--run-ignored all)
cargo nextest run --workspace --locked --no-fail-fast "${ignored[@]}" "$@"
echo "== terraform: validate, mocked plans, rendered configs, apply against moto"
scripts/test-terraform.sh "$CARGO_TARGET_DIR/debug/cellmesh"

# Starts `cellmesh dev` with the arguments before `--`, runs the drills
# after it ("scenario duration [chaos run arguments]", seed 7) against it,
# and stops it. Drills that failed because librdkafka's mock cluster
# aborted the deployment (a fault of the mock, see the README) run once more
# on a fresh one; any other failure ends the run.
run_drills() {
  local rc=0
  drills_once "$@" || rc=$?
  if [ "$rc" = 2 ]; then
    echo "librdkafka's mock cluster aborted the deployment (rdkafka_mock_cgrp.c, see the README): the drills run once more"
    rc=0
    drills_once "$@" || rc=$?
  fi
  [ "$rc" = 0 ] || exit 1
}

# One deployment and its drills: 0 when every drill held, 2 when one failed
# and the deployment's output shows the mock's abort, 1 otherwise. A failed
# deployment's data dir is kept for its report.
drills_once() {
  local extra=()
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
  local bin="$CARGO_TARGET_DIR/debug/cellmesh" drill_dir
  drill_dir=$(mktemp -d)
  start_dev "$bin" "$drill_dir" --base-port 21000 --latency 20ms "${extra[@]}" || return 1
  local drill failed=0
  for drill in "$@"; do
    set -- $drill
    echo "== chaos drill: $1 for $2 (seed 7)"
    if ! "$bin" chaos run "$1" --dev "$drill_dir" --duration "$2" --seed 7 --report "$drill_dir/$1.json" "${@:3}"; then
      echo "report: $drill_dir/$1.json"; failed=1; break
    fi
  done
  stop_dev
  if [ "$failed" = 1 ] && grep -q "rdkafka_mock_cgrp\.c:[0-9]*: .*Assertion" "$drill_dir/dev.out"; then
    failed=2
  fi
  [ "$failed" != 0 ] || rm -rf "$drill_dir"
  return "$failed"
}

if [ -z "${CELLMESH_SKIP_DRILL:-}" ]; then
  echo "== chaos drills against cellmesh dev: mixed faults, slow disk, queue outage"
  # The workspace build has fail points (the tests crate turns them on).
  # The tenant moves first: bound to two regions, it moves inside them and the
  # audit finds none of its bytes in the third.
  run_drills -- "tenant-move 12s --pin-regions eu-west,us-east" "mixed 15s" "slow-disk 8s" "queue-outage 8s" \
    "tenant-move-kill 15s" "move-then-fail-over 12s"
  echo "== chaos drill on the Kafka queue (librdkafka's mock cluster): a broker down and up"
  run_drills --kafka mock -- "broker-outage 8s"
  echo "== chaos drills with mutual TLS on every internal link and synchronous replication (cellmesh dev --tls --replication sync)"
  run_drills --tls --replication sync -- "mixed 10s" "move-then-fail-over 12s"
  echo "== the loss of a region: backups, failover to other regions, rebuild from backups, failback (a sync and an async tenant)"
  run_drills --replication sync --other-mode-tenants 9002 -- "region-loss 40s"
  echo "== rolling upgrade under load: a deployment of the previous release moved to this one process by process"
  # --tls: a plaintext config of this release says insecure_plaintext, which 0.2.0 refuses.
  run_drills --tls --process-binary "$CELLMESH_PREVIOUS_BIN" -- "rolling-upgrade 60s --previous $CELLMESH_PREVIOUS_BIN"
fi
