#!/usr/bin/env bash
# A tenant move's speed: one `cellmesh dev` deployment (LATENCY between
# regions), a fresh tenant filled through the edge with CONVERSATIONS
# conversations of MESSAGES messages (two members each), then moved whole
# to the other cell of its region while senders keep writing to it.
# Figures go to stdout and to OUT/tenant-move.json.
#
#   scripts/bench-tenant-move.sh [CONVERSATIONS=10000] [MESSAGES=10] [LATENCY=20ms] [OUT=data/bench-tenant-move]
#   PROFILE=release scripts/bench-tenant-move.sh 100000   # optimised build
#   PARALLEL=16 scripts/bench-tenant-move.sh            # copies in flight (default 8)
#   HOT_MESSAGES=2 SETTLE=15s scripts/bench-tenant-move.sh 1000 20   # most history cold before the move
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

conversations="${1:-10000}"
messages="${2:-10}"
latency="${3:-20ms}"
out="${4:-data/bench-tenant-move}"
build_bin
bin="$BIN"

rm -rf "$out" && mkdir -p "$out"
trap stop_dev EXIT
tiering=()
[ -z "${HOT_MESSAGES:-}" ] || tiering=(--hot-messages "$HOT_MESSAGES")
start_dev "$bin" "$out/dev" --base-port 23000 --latency "$latency" "${tiering[@]}"

"$bin" bench tenant-move --dev "$out/dev" --conversations "$conversations" \
  --messages "$messages" --members 2 --parallel "${PARALLEL:-8}" --settle "${SETTLE:-0s}" --json "$out/tenant-move.json"
