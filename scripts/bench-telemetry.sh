#!/usr/bin/env bash
# The cost of telemetry: `bench send` against one standalone cell with its
# metrics and traces on (`metrics_listen` set, every gRPC call counted and
# timed, /metrics scraped every 2 s as Prometheus would; `[telemetry]`
# exporting spans at the default 5% ratio to an OTLP receiver) and both
# off, alternating off/on ROUNDS times on the same binary and data. Prints each run's figures
# and the throughput loss of the mean; JSON files go under OUT.
#
#   scripts/bench-telemetry.sh [DURATION=20s] [ROUNDS=2] [OUT=data/bench-telemetry]
#   PROFILE=release scripts/bench-telemetry.sh     # optimised build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

duration="${1:-20s}"
rounds="${2:-2}"
out="${3:-data/bench-telemetry}"
build_bin
bin="$BIN"
port=23400 metrics_port=23401 otlp_port=23402

rm -rf "$out" && mkdir -p "$out"
cell_pid="" scraper_pid="" sink_pid=""
"$bin" bench otlp-sink --listen "127.0.0.1:$otlp_port" > "$out/otlp-sink.log" 2>&1 &
sink_pid=$!
stop_cell() {
  [ -z "$scraper_pid" ] || kill "$scraper_pid" 2>/dev/null || true
  [ -z "$cell_pid" ] || { kill "$cell_pid" 2>/dev/null || true; wait "$cell_pid" 2>/dev/null || true; }
  cell_pid="" scraper_pid=""
}
trap 'stop_cell; kill $sink_pid 2>/dev/null || true' EXIT

run() {
  local mode="$1" i="$2" listen="" endpoint=""
  [ "$mode" = on ] && listen="127.0.0.1:$metrics_port" endpoint="http://127.0.0.1:$otlp_port"
  bench_cell_config "$out/cell-$mode.toml" "$out/cell" "$port" <<TOML
metrics_listen = "$listen"
[telemetry]
endpoint = "$endpoint"
TOML
  RUST_LOG=warn "$bin" cell --config "$out/cell-$mode.toml" 2>>"$out/cell.log" &
  cell_pid=$!
  for _ in $(seq 100); do [ -s "$out/cell/cell.addr" ] && break; sleep 0.1; done
  if [ "$mode" = on ]; then
    ( while sleep 2; do curl -sf -H 'Accept: application/openmetrics-text' \
        "http://127.0.0.1:$metrics_port/metrics" >/dev/null || true; done ) &
    scraper_pid=$!
  fi
  echo "== metrics and traces $mode (round $i), $duration"
  "$bin" bench send --endpoint "http://127.0.0.1:$port" --duration "$duration" \
    --concurrency 64 --conversations 256 --members 8 --json "$out/send-$mode-$i.json"
  stop_cell
  rm -f "$out/cell/cell.addr"
}

for i in $(seq "$rounds"); do
  run off "$i"
  run on "$i"
done

python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def mean(mode, key):
    runs = [json.load(open(f"{out}/send-{mode}-{i}.json")) for i in range(1, rounds + 1)]
    return sum(r[key] for r in runs) / len(runs)
key = "throughput_per_s"
off, on = mean("off", key), mean("on", key)
print(f"telemetry off: {off:,.0f} acked sends/s; on: {on:,.0f}/s; loss {100 * (off - on) / off:.1f}%")
json.dump({"off_per_sec": off, "on_per_sec": on, "loss_pct": 100 * (off - on) / off},
          open(f"{out}/summary.json", "w"), indent=2)
PY
