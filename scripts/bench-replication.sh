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
build_bin
bin="$BIN"

rm -rf "$out" && mkdir -p "$out"
trap stop_dev EXIT
start_dev "$bin" "$out/dev" --base-port 22000 --latency "$latency" \
  --replication async --other-mode-tenants 2

demo=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["demo"]["tenant"])' "$out/dev/dev.json")
for run in "async:$demo" "sync:2"; do
  mode="${run%%:*}" tenant="${run#*:}"
  echo "== replication $mode (tenant $tenant), $duration, $latency between regions"
  "$bin" bench send --dev "$out/dev" --tenant "$tenant" --duration "$duration" \
    --concurrency 64 --conversations 256 --members 8 --json "$out/send-$mode.json"
done
