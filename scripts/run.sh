#!/usr/bin/env bash
# Runs cellmesh on this machine: for now one cell on 127.0.0.1:7400 with its
# data under ./data/cell. Talk to it with `cellmesh chat` (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup

cargo build --release --locked --bin cellmesh
exec "$CARGO_TARGET_DIR/release/cellmesh" cell --config config/cell.toml "$@"
