#!/usr/bin/env bash
# Route writes and linearizable lookups of the RoutingService against etcd
# on this machine, three replicas each, all fsyncing:
#  - writes: a three-replica router group of its own (`cellmesh router`,
#    no watchers, nothing else running) against a three-member etcd
#    cluster on loopback; then the same workload against the three routers
#    of a running `cellmesh dev` deployment (no latency injected between
#    its regions, every cell, edge and control plane watching);
#  - linearizable lookups: the deployment's routers against etcd.
# Figures go to stdout and to OUT/router-write.json (own group),
# OUT/router-write-deployment.json and OUT/router-linearizable.json.
#
#   scripts/bench-router.sh [DURATION=10s] [CONCURRENCY=32] [OUT=data/bench-router]
#   PROFILE=release scripts/bench-router.sh   # optimised build
#   BIN=/path/to/cellmesh scripts/bench-router.sh   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-10s}"
concurrency="${2:-32}"
out="${3:-data/bench-router}"
if [ -z "${BIN:-}" ]; then
  build_bin
fi
bin="$BIN"

rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() {
  stop_dev
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# A router group of its own: replica i serves the API on 2610i and Raft on
# 2620i; replica 1 bootstraps the group.
routers=""
for i in 1 2 3; do
  routers+="${routers:+,}http://127.0.0.1:2610$i"
  {
    echo "node_id = $i"
    echo "region = \"r$i\""
    echo "data_dir = \"$out/router$i\""
    echo "api_listen = \"127.0.0.1:2610$i\""
    echo "raft_listen = \"127.0.0.1:2620$i\""
    echo "insecure_plaintext = true"
    echo "[cluster]"
    echo "bootstrap = $([ "$i" = 1 ] && echo true || echo false)"
    for j in 1 2 3; do
      echo "[[cluster.members]]"
      echo "node_id = $j"
      echo "region = \"r$j\""
      echo "raft_addr = \"http://127.0.0.1:2620$j\""
      echo "api_addr = \"http://127.0.0.1:2610$j\""
    done
  } >"$out/router$i.toml"
done
for i in 1 2 3; do
  "$bin" router --config "$out/router$i.toml" >"$out/router$i.log" 2>&1 &
  pids+=($!)
done

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
  pids+=($!)
done
for _ in $(seq 1 60); do
  curl -sf http://127.0.0.1:25381/health | grep -q '"health":"true"' && break
  sleep 0.5
done

echo "== write: a router group of its own vs etcd, $concurrency in flight, $duration"
"$bin" bench router --routers "$routers" --etcd "$clients" --compare --op write \
  --concurrency "$concurrency" --duration "$duration" --json "$out/router-write.json"
for pid in "${pids[@]:0:3}"; do kill "$pid" 2>/dev/null || true; done

start_dev "$bin" "$out/dev" --base-port 25000 --latency 0ms
echo "== write: the routers of a running deployment vs etcd, $concurrency in flight, $duration"
"$bin" bench router --dev "$out/dev" --etcd "$clients" --compare --op write \
  --concurrency "$concurrency" --duration "$duration" --json "$out/router-write-deployment.json"
echo "== linearizable: the routers of a running deployment vs etcd, $concurrency in flight, $duration"
"$bin" bench router --dev "$out/dev" --etcd "$clients" --compare --op linearizable \
  --concurrency "$concurrency" --duration "$duration" --json "$out/router-linearizable.json"
