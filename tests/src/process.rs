//! Components as their own OS processes (the `cellmesh` binary), for tests
//! that SIGKILL or SIGSTOP them: a cell, a control-plane replica.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cellmesh_control_plane::server::ControlPlaneConfig;

use crate::{cellmesh_bin, eventually};

/// A child process of one role; SIGKILLed when dropped.
struct RoleProcess {
    child: Child,
}

impl RoleProcess {
    fn spawn(mut command: Command) -> Self {
        let child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cellmesh");
        Self { child }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of a child this handle still owns.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RoleProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cell running as its own OS process.
pub struct CellProcess {
    process: RoleProcess,
    pub endpoint: String,
}

impl CellProcess {
    /// Starts `cellmesh cell` on port 0 over `data_dir` and waits until it
    /// serves.
    pub async fn start(data_dir: &Path) -> Self {
        Self::spawn(data_dir, None).await
    }

    /// Starts `cellmesh cell --config` with `config` (written next to the
    /// data), on port 0 over `data_dir`.
    pub async fn start_configured(data_dir: &Path, config: &cellmesh_cell::CellConfig) -> Self {
        let path = data_dir.join("cell.toml");
        std::fs::write(&path, toml::to_string(config).expect("config as TOML")).unwrap();
        Self::spawn(data_dir, Some(&path)).await
    }

    async fn spawn(data_dir: &Path, config: Option<&Path>) -> Self {
        let addr_file = data_dir.join(cellmesh_cell::server::ADDR_FILE);
        let _ = std::fs::remove_file(&addr_file);
        let mut command = Command::new(cellmesh_bin());
        command.arg("cell");
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        command
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir);
        let mut process = Self {
            process: RoleProcess::spawn(command),
            endpoint: String::new(),
        };
        let started = eventually(Duration::from_secs(30), || {
            let addr_file = addr_file.clone();
            async move { addr_file.exists() }
        })
        .await;
        assert!(started, "cell process did not start");
        let addr = std::fs::read_to_string(&addr_file).expect("addr file");
        process.endpoint = format!("http://{}", addr.trim());
        process
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP` to hang the process,
    /// `libc::SIGCONT` to resume it).
    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether the process has ended on its own (e.g. a fail point's
    /// abort).
    pub fn exited(&mut self) -> bool {
        matches!(self.process.child.try_wait(), Ok(Some(_)))
    }
}

/// A control-plane replica running as its own OS process, its admin API on
/// a free loopback port.
pub struct ControlPlaneProcess {
    process: RoleProcess,
    /// `http://127.0.0.1:PORT` of the admin API.
    pub admin: String,
}

impl ControlPlaneProcess {
    /// Starts `cellmesh control-plane --config` with `config` (written into
    /// `dir`; its admin address is set here) and waits until the admin API
    /// answers.
    pub async fn start(dir: &Path, mut config: ControlPlaneConfig) -> Self {
        let port = crate::free_port();
        config.admin_listen = format!("127.0.0.1:{port}");
        config.console_listen = String::new();
        let path = dir.join(format!("control-plane-{port}.toml"));
        std::fs::write(&path, toml::to_string(&config).expect("config as TOML")).unwrap();
        let mut command = Command::new(cellmesh_bin());
        command.arg("control-plane").arg("--config").arg(&path);
        let process = Self {
            process: RoleProcess::spawn(command),
            admin: format!("http://127.0.0.1:{port}"),
        };
        let serving = eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(serving, "the control plane's admin API did not come up");
        process
    }

    /// SIGKILL: no shutdown, no release of its leadership.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}
