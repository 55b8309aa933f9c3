#!/usr/bin/env bash
# Route writes and linearizable lookups of the RoutingService against etcd
# on this machine, three replicas each: the three routers of a `cellmesh
# dev` deployment (no latency injected between its regions) and a
# three-member etcd cluster on loopback, both fsyncing. Figures go to
# stdout and to OUT/router-write.json and OUT/router-linearizable.json.
#
#   scripts/bench-router.sh [DURATION=10s] [CONCURRENCY=32] [OUT=data/bench-router]
#   PROFILE=release scripts/bench-router.sh   # optimised build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-10s}"
concurrency="${2:-32}"
out="${3:-data/bench-router}"
build_bin
bin="$BIN"

rm -rf "$out" && mkdir -p "$out"
etcd_pids=()
cleanup() {
  stop_dev
  for pid in "${etcd_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
start_dev "$bin" "$out/dev" --base-port 25000 --latency 0ms

cluster="" clients=""
for i in 1 2 3; do
  cluster+="${cluster:+,}e$i=http://127.0.0.1:2539$i"
  clients+="${clients:+,}http://127.0.0.1:2538$i"
done
for i in 1 2 3; do
  etcd --name "e$i" --data-dir "$out/etcd$i" \
    --listen-client-urls "http://127.0.0.1:2538$i" --advertise-client-urls "http://127.0.0.1:2538$i" \
    --listen-peer-urls "http://127.0.0.1:2539$i" --initial-advertise-peer-urls "http://127.0.0.1:2539$i" \
    --initial-cluster "$cluster" --initial-cluster-state new >"$out/etcd$i.log" 2>&1 &
  etcd_pids+=($!)
done
for _ in $(seq 1 60); do
  curl -sf http://127.0.0.1:25381/health | grep -q '"health":"true"' && break
  sleep 0.5
done

for op in write linearizable; do
  echo "== $op: routers vs etcd, $concurrency in flight, $duration"
  "$bin" bench router --dev "$out/dev" --etcd "$clients" --compare --op "$op" \
    --concurrency "$concurrency" --duration "$duration" --json "$out/router-$op.json"
done
