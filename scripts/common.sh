# Shared by the scripts in this folder: where builds are cached, and the
# one-time installation of the system packages the build needs.

# Builds live outside the clone so a fresh clone reuses compiled RocksDB.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cellmesh/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# Installs what is missing (protoc, cmake, libclang, a C++ compiler) with
# apt-get; does nothing when everything is present.
setup() {
  local need=()
  command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
  command -v cmake >/dev/null 2>&1 || need+=(cmake)
  command -v c++ >/dev/null 2>&1 || need+=(g++)
  command -v clang >/dev/null 2>&1 || need+=(clang)
  dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
  if ((${#need[@]})); then
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing missing system packages: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: system packages present"
  fi
  for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
      echo "setup: adding rust component $component"
      rustup component add "$component"
    fi
  done
  if ! cargo nextest --version >/dev/null 2>&1; then
    echo "setup: installing cargo-nextest"
    cargo install cargo-nextest --locked
  fi
  mkdir -p "$CARGO_TARGET_DIR"
}
