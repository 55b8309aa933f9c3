#!/usr/bin/env bash
# Fuzzes request validation (arbitrary requests against a running cell)
# and config parsing (arbitrary TOML for every role) with cargo-fuzz, each
# target for FUZZ_SECONDS (default 120). Not part of the test suite: it
# needs the nightly toolchain and builds the product once more (about 10
# GB under ~/.cache/cellmesh/fuzz-target), with coverage instrumentation.
# A crash is kept in fuzz/artifacts/<target>/ and fails the script; the
# corpus grows in fuzz/corpus/<target>/ between runs.
#   scripts/fuzz.sh                     # both targets, 120 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh config_parsing
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
setup
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
# Instrumented builds are kept apart from the product's cache.
export CARGO_TARGET_DIR="$HOME/.cache/cellmesh/fuzz-target"
seconds="${FUZZ_SECONDS:-120}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_parsing request_validation)
for target in "${targets[@]}"; do
  echo "== fuzz $target for ${seconds}s"
  mkdir -p "fuzz/corpus/$target"
  # No sanitizer: the targets and what they call are safe Rust (RocksDB's
  # C++ is not instrumented either way), and an AddressSanitizer build of
  # the whole product needs tens of GB more disk. Panics, overflows (debug
  # assertions are on) and timeouts are what the targets look for.
  cargo +nightly fuzz run --sanitizer none --debug-assertions --fuzz-dir fuzz "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -print_final_stats=1
done
