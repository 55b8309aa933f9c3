#!/usr/bin/env bash
# Runs cellmesh on this machine: `cellmesh dev`, a whole three-region
# deployment (routers, cells, edges, control plane as separate processes)
# with its data under ./data/dev. Extra arguments go to `cellmesh dev`
# (e.g. --latency 80ms, --etcd). Ctrl-C stops it; running it again resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

cargo build --release --locked --bin cellmesh
exec "$CARGO_TARGET_DIR/release/cellmesh" dev --data-dir data/dev "$@"
