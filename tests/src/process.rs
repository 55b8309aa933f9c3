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

    /// SIGTERM, then waits for the exit (SIGKILL after 20 s).
    async fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
    }
}

/// A router replica running as its own OS process (any build of the
/// binary), on the fixed addresses of its config.
pub struct RouterProcess {
    process: RoleProcess,
}

impl RouterProcess {
    /// Starts `bin router --config` with `config` (written into its data
    /// dir).
    pub fn start(bin: &Path, config: &cellmesh_router::config::RouterConfig) -> Self {
        Self::start_without(bin, config, &[])
    }

    /// [`Self::start`] with the config's top-level `fields` left out (an
    /// earlier release refuses the fields it does not know).
    pub fn start_without(
        bin: &Path,
        config: &cellmesh_router::config::RouterConfig,
        fields: &[&str],
    ) -> Self {
        let path = config.data_dir.join("router.toml");
        std::fs::create_dir_all(&config.data_dir).unwrap();
        let mut table = toml::Table::try_from(config).expect("config as TOML");
        for field in fields {
            table.remove(*field);
        }
        std::fs::write(&path, toml::to_string(&table).expect("config as TOML")).unwrap();
        let mut command = Command::new(bin);
        command.arg("router").arg("--config").arg(&path);
        Self {
            process: RoleProcess::spawn(command),
        }
    }

    /// A graceful stop (SIGTERM), waiting for the exit.
    pub async fn stop(mut self) {
        self.process.terminate().await;
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

    /// Starts `bin cell --config FILE` (a config written for that build)
    /// on port 0 over `data_dir`.
    pub async fn start_built(bin: &Path, data_dir: &Path, config_toml: &str) -> Self {
        let path = data_dir.join("cell.toml");
        std::fs::write(&path, config_toml).unwrap();
        Self::spawn_bin(bin, data_dir, Some(&path)).await
    }

    /// A graceful stop (SIGTERM), waiting for the exit.
    pub async fn stop(mut self) {
        self.process.terminate().await;
    }

    async fn spawn(data_dir: &Path, config: Option<&Path>) -> Self {
        Self::spawn_bin(&cellmesh_bin(), data_dir, config).await
    }

    async fn spawn_bin(bin: &Path, data_dir: &Path, config: Option<&Path>) -> Self {
        let addr_file = data_dir.join(cellmesh_cell::server::ADDR_FILE);
        let _ = std::fs::remove_file(&addr_file);
        let mut command = Command::new(bin);
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
