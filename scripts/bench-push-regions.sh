#!/usr/bin/env bash
# Send -> push latency across regions: one `cellmesh dev` deployment with
# LATENCY between regions, the bench's conversations moved to us-east/c1
# while their members' homes stay on eu-west/c1 (every push crosses from
# the owner to the home cell), devices streaming through every region's
# edge and senders sending through every region's edge, at RATE sends/s.
# Prints p50/p95/p99 per (sender region, device region) and writes JSON.
#
#   scripts/bench-push-regions.sh [DURATION=60s] [RATE=200] [LATENCY=20ms] [OUT=data/bench-push-regions]
#   PROFILE=release scripts/bench-push-regions.sh     # optimised build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-60s}"
rate="${2:-200}"
latency="${3:-20ms}"
out="${4:-data/bench-push-regions}"
build_bin
bin="$BIN"

rm -rf "$out" && mkdir -p "$out"
trap stop_dev EXIT
start_dev "$bin" "$out/dev" --base-port 22000 --latency "$latency"
"$bin" bench push --dev "$out/dev" --devices 60 --group-size 6 --direct-share 0.5 \
  --senders 12 --rate "$rate" --duration "$duration" --conversations-on us-east/c1 \
  --json "$out/push.json"
