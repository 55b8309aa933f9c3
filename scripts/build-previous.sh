#!/usr/bin/env bash
# Builds the previous release's `cellmesh` binary for the mixed-version test
# (tests/tests/it/mixed_version.rs): the commit named in
# scripts/previous-release, checked out as a git worktree under the build
# cache and built in the same target directory (the dependencies are
# shared; its own crates build beside this tree's), then copied to
# ~/.cache/cellmesh/previous/cellmesh. Does nothing when that binary was
# built from that commit already. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
read -r tag commit < scripts/previous-release
out="$HOME/.cache/cellmesh/previous"
bin="$out/cellmesh"
if [ -x "$bin" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$commit" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$out"
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  # A shallow clone: fetch the history it was cut from.
  git fetch --quiet --unshallow >/dev/null 2>&1 || git fetch --quiet origin "$commit" >/dev/null 2>&1 || true
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "the previous release $tag ($commit) is not in this clone's history" >&2
  exit 1
fi
tree="$out/tree"
git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"
git worktree prune
git worktree add --quiet --detach "$tree" "$commit"
echo "building the previous release $tag ($commit)" >&2
# The binary is copied out before anything builds this tree's again (both
# land on the same path in the target directory).
# Its Cargo.toml predates the build-override setting of this one's: given
# here, its build scripts match this tree's, and the C and C++ libraries
# (RocksDB, librdkafka, ring) are compiled once for both.
(cd "$tree" && cargo build --config profile.dev.build-override.debug=false --locked --bin cellmesh >&2)
cp "$CARGO_TARGET_DIR/debug/cellmesh" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$commit" > "$out/commit"
git worktree remove --force "$tree"
echo "$bin"
