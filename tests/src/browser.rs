//! The web console as a browser sees it: headless Chromium loads a page,
//! runs its scripts for a few seconds, and the DOM is returned.

use std::net::SocketAddr;
use std::time::Duration;

/// The DOM after the page's scripts ran for a few seconds.
pub async fn rendered(console: SocketAddr) -> String {
    let profile = tempfile::tempdir().unwrap();
    let chromium = std::env::var("CELLMESH_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let run = tokio::process::Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("http://{console}/"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("chromium finishes")
        .unwrap_or_else(|e| panic!("cannot run {chromium} (scripts/common.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
