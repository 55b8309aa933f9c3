//! The web client (`clients/web`) for the tests that run it: its npm
//! packages installed when the lock file changed, the SDK, its tests and
//! the app built when their sources changed (`build.mjs`), and a Node
//! test file run with the environment a test gives it.

use std::path::PathBuf;
use std::process::Command;

/// `clients/web` in this checkout.
pub fn client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/web")
}

fn run(program: &str, args: &[&str]) {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let out = Command::new(program)
        .args(args)
        .current_dir(client_dir())
        .env("npm_config_cache", format!("{home}/.cache/cellmesh/npm"))
        .output()
        .unwrap_or_else(|e| panic!("{program} runs (scripts/common.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs and builds what is stale (what `scripts/common.sh setup` does).
pub fn build() {
    let dir = client_dir();
    let lock = std::fs::read(dir.join("package-lock.json")).expect("package-lock.json");
    if std::fs::read(dir.join("node_modules/.cellmesh-lock")).ok() != Some(lock.clone()) {
        run("npm", &["ci", "--no-audit", "--no-fund"]);
        std::fs::write(dir.join("node_modules/.cellmesh-lock"), lock).expect("node_modules");
    }
    run("node", &["build.mjs"]);
}

/// Runs the Node tests under `dist/<tests>` with `env`; panics with their
/// report unless all pass, and returns it.
pub async fn node_tests(tests: &str, env: &[(&str, String)]) -> String {
    let out = tokio::process::Command::new("node")
        .args(["--test", "--test-concurrency=1", &format!("dist/{tests}/")])
        .current_dir(client_dir())
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .kill_on_drop(true)
        .output()
        .await
        .expect("node runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the {tests} tests failed:\n{report}");
    report
}
