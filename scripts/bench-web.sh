#!/usr/bin/env bash
# The web app in headless Chromium against `cellmesh dev` with LATENCY
# between regions: first screen after a reload (warm IndexedDB) and on a
# fresh profile (cold), send -> rendered on another user's page across
# regions (eu-west sender, ap-south reader), and the page's memory after
# MESSAGES messages in one conversation. Prints the figures and writes JSON.
#
#   scripts/bench-web.sh [LATENCY=20ms] [OUT=data/bench-web]
#   RUNS=30 SENDS=300 MESSAGES=10000 PROFILE=release scripts/bench-web.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

latency="${1:-20ms}"
out="${2:-data/bench-web}"
build_bin
rm -rf "$out" && mkdir -p "$out"
trap stop_dev EXIT
start_dev "$BIN" "$out/dev" --base-port 22400 --latency "$latency"
node clients/web/dist/bench/web.bench.js "$out/dev/dev.json" "$out/web.json"
