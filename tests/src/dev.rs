//! `cellmesh dev` as a child process for end-to-end tests: started on a
//! fixed port base in a temp dir, interrupted (with every component) when
//! the handle drops, and its `dev.json` awaited.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cellmesh_bin;

/// A `cellmesh dev` child that is interrupted (and its components with it)
/// even when the test fails midway.
pub struct Dev(Option<Child>);

impl Dev {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }
    pub fn take(mut self) -> Child {
        self.0.take().expect("running")
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: kill(2) on the child we spawned.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub use crate::ports::dev_base as port_base;

/// Starts `cellmesh dev` over `dir` on ports from `base`, with `extra`
/// arguments.
pub fn start_dev(dir: &Path, base: u16, extra: &[&str]) -> Dev {
    let _ = std::fs::remove_file(dir.join("dev.json"));
    Dev(Some(
        Command::new(cellmesh_bin())
            .args(["dev", "--data-dir"])
            .arg(dir)
            .args(["--base-port", &base.to_string(), "--latency", "20ms"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dev.stderr")).expect("log file"))
            .spawn()
            .expect("cellmesh dev starts"),
    ))
}

/// The deployment's `dev.json`, once it is written.
pub async fn wait_info(dir: &Path, dev: &mut Child) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = dev.try_wait().unwrap() {
            let stderr = std::fs::read_to_string(dir.join("dev.stderr")).unwrap_or_default();
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            panic!(
                "cellmesh dev exited early ({status}): {}; see {}/logs",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
                dir.display()
            );
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("dev.json"))
            && let Ok(v) = serde_json::from_str::<Value>(&text)
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "dev.json never appeared; see {}/logs",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
