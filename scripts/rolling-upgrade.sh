#!/usr/bin/env bash
# The rolling-upgrade drill at length: `cellmesh dev` started on the
# previous release (scripts/build-previous.sh), every component moved to
# this build one at a time under the drill's workload (routers, control
# plane, cells, edges), one cell and one router rolled back to the previous
# release and forward again, the cluster version finalized; the history
# checker judges every invariant. DURATION (default 150s) must outlast the
# whole procedure; SEED picks the rolled-back router.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup
previous=$(scripts/build-previous.sh)
# The previous release's build left its binary on the same path.
rm -f "$CARGO_TARGET_DIR/debug/cellmesh"
cargo build --workspace --bins --locked
bin="$CARGO_TARGET_DIR/debug/cellmesh"
dir=$(mktemp -d)
trap stop_dev EXIT
start_dev "$bin" "$dir" --base-port 21000 --latency 20ms --process-binary "$previous"
"$bin" chaos run rolling-upgrade --dev "$dir" --duration "${DURATION:-150s}" --seed "${SEED:-7}" \
  --previous "$previous" --report "$dir/rolling-upgrade.json"
echo "report: $dir/rolling-upgrade.json"
