#!/usr/bin/env bash
# The cost of replication mode `sync`: one `cellmesh dev` deployment whose
# cells replicate the demo tenant asynchronously and tenant 2 synchronously
# (its standbys: the same-region fallback and a cell in another region,
# LATENCY apart), and `bench send` through the edge for each tenant in turn.
# Figures go to stdout and to JSON files under OUT.
#
#   scripts/bench-replication.sh [DURATION=20s] [LATENCY=20ms] [OUT=data/bench-replication]
#   PROFILE=release scripts/bench-replication.sh     # optimised build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-20s}"
latency="${2:-20ms}"
out="${3:-data/bench-replication}"
profile="${PROFILE:-debug}"
flag=()
[ "$profile" = debug ] || flag=(--profile "$profile")
cargo build --workspace --bins --locked "${flag[@]}"
bin="$CARGO_TARGET_DIR/$profile/cellmesh"

rm -rf "$out" && mkdir -p "$out"
"$bin" dev --data-dir "$out/dev" --base-port 22000 --latency "$latency" \
  --replication async --other-mode-tenants 2 >"$out/dev.out" 2>&1 &
dev_pid=$!
trap 'kill -INT "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do [ -f "$out/dev/dev.json" ] && break; sleep 0.5; done
[ -f "$out/dev/dev.json" ] || { echo "cellmesh dev did not come up:"; tail -20 "$out/dev.out"; exit 1; }

demo=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["demo"]["tenant"])' "$out/dev/dev.json")
for run in "async:$demo" "sync:2"; do
  mode="${run%%:*}" tenant="${run#*:}"
  echo "== replication $mode (tenant $tenant), $duration, $latency between regions"
  "$bin" bench send --dev "$out/dev" --tenant "$tenant" --duration "$duration" \
    --concurrency 64 --conversations 256 --members 8 --json "$out/send-$mode.json"
done
