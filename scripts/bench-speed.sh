#!/usr/bin/env bash
# The speed figures of the README's table in one run, each JSON file under
# OUT: the storage ceiling (`bench storage`), sends into groups of 8 against
# one standalone cell (`bench send --ceiling`), pushes to 1,000 and to 10,000
# online devices (each beside its ceiling, `bench push --ceiling`: the same
# bench against a server with nothing behind its gRPC services), a group of
# 100,000 members (`bench group`) and the failover of a hung cell in a
# `cellmesh dev` deployment (`bench failover`). Route writes against etcd
# are `scripts/bench-router.sh`.
#
#   scripts/bench-speed.sh [DURATION=30s] [OUT=data/bench-speed]
#   PROFILE=release scripts/bench-speed.sh          # optimised build (the table's)
#   BIN=/path/to/cellmesh scripts/bench-speed.sh    # another build, e.g. a previous release
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-30s}"
out="${2:-data/bench-speed}"
if [ -z "${BIN:-}" ]; then
  build_bin
fi
bin="$BIN"
port=23500

rm -rf "$out" && mkdir -p "$out"
cell_pid=""
stop_cell() {
  [ -z "$cell_pid" ] || { kill "$cell_pid" 2>/dev/null || true; wait "$cell_pid" 2>/dev/null || true; }
  cell_pid=""
}
trap 'stop_cell; stop_dev' EXIT

# A standalone cell on a fresh directory, rate limits out of the way.
start_cell() {
  local dir="$out/cell-$1"
  mkdir -p "$dir"
  bench_cell_config "$dir.toml" "$dir" "$port" < /dev/null
  RUST_LOG=warn "$bin" cell --config "$dir.toml" 2>>"$out/cell.log" &
  cell_pid=$!
  for _ in $(seq 100); do [ -s "$dir/cell.addr" ] && return 0; sleep 0.1; done
  echo "the cell did not start; see $out/cell.log" >&2
  return 1
}
endpoint="http://127.0.0.1:$port"

echo "== ceiling: bench storage, 64 writers, groups of 8"
"$bin" bench storage --concurrency 64 --duration "$duration" --dir "$out/storage" \
  --json "$out/storage.json"
rm -rf "$out/storage"

echo "== bench send, groups of 8, concurrency 64"
start_cell send
"$bin" bench send --endpoint "$endpoint" --concurrency 64 --conversations 256 --members 8 \
  --duration "$duration" --ceiling "$out/storage.json" --json "$out/send.json"
stop_cell

for devices in 1000 10000; do
  echo "== bench push, $devices devices, 5,000 sends/s (half 1:1, half groups of 50)"
  start_cell "push-$devices"
  "$bin" bench push --endpoint "$endpoint" --devices "$devices" --rate 5000 \
    --duration "$duration" --json "$out/push-$devices.json"
  stop_cell
  echo "== ceiling of a push: the same bench against a server with nothing behind gRPC, $devices devices"
  "$bin" bench push --ceiling --devices "$devices" --rate 5000 \
    --duration "$duration" --json "$out/push-ceiling-$devices.json"
done

if "$bin" bench group --help >/dev/null 2>&1; then
  echo "== bench group, 100,000 members, 1,000 online (a cell of its own)"
  RUST_LOG=warn "$bin" bench group --members 100000 --online 1000 \
    --duration "$duration" --json "$out/group.json"
fi

echo "== bench failover, cellmesh dev"
start_dev "$bin" "$out/dev" --base-port 23600
"$bin" bench failover --dev "$out/dev" --rounds 5 --json "$out/failover.json"
stop_dev

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None
for name in ["storage", "send", "push-1000", "push-ceiling-1000", "push-10000",
             "push-ceiling-10000", "group", "failover"]:
    r = load(name)
    if r is None:
        continue
    lat = r.get("latency_ms", {})
    params = r.get("params", {})
    share = (f", {100 * params['share_of_ceiling']:.0f}% of the ceiling"
             if "share_of_ceiling" in params else "")
    print(f"{name:>18}: {r.get('throughput_per_s', 0):>10,.0f}/s  p50 {lat.get('p50', 0):.1f} ms"
          f"  p99 {lat.get('p99', 0):.1f} ms{share}")
    extra = {k: params[k] for k in ["sends_per_s", "group_send_p99_ms", "list_conversations_p99_ms",
                                    "unread_mismatches", "neighbour_p99_ms_alone",
                                    "neighbour_p99_ms_beside_the_group",
                                    "neighbour_p99_ms_alone_median_of_windows",
                                    "neighbour_p99_ms_beside_median_of_windows", "join_burst_s",
                                    "route_switched_ms"] if k in params}
    if extra:
        print(" " * 20 + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in extra.items()))
PY
