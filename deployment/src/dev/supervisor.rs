//! Child processes of `cellmesh dev`: started from the same binary with a
//! role and a config file, logging to `DATA_DIR/logs/NAME.log`, restarted
//! (with a report) when they die unexpectedly, and stopped cleanly — SIGTERM,
//! then SIGKILL after a grace period — in reverse start order. A child runs
//! another binary from its next start when `DATA_DIR/binaries/NAME` names
//! one ([`binary_file`]): a rolling upgrade writes it and stops the child.
//! A child whose [`held_file`] exists is not restarted while it does: a
//! drill that loses a region holds its processes down, deletes their data,
//! and releases them once it has rebuilt it. Children get SIGTERM when
//! `cellmesh dev` itself dies, however it dies, so none outlives it on
//! the deployment's ports.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cellmesh_chaos::target::held_file;
use cellmesh_chaos::upgrade::binary_file;

pub struct Spec {
    pub name: String,
    pub args: Vec<String>,
}

/// Another program than this binary (etcd).
struct External {
    program: String,
}

struct Running {
    spec: Spec,
    program: Option<External>,
    child: Child,
    restarts: u32,
    started: Instant,
    /// Reported as held down (once per hold).
    held: bool,
}

pub struct Supervisor {
    /// The binary children run unless told otherwise.
    exe: PathBuf,
    data_dir: PathBuf,
    logs: PathBuf,
    children: Vec<Running>,
}

impl Supervisor {
    /// Children run `exe` (default: this binary) unless their
    /// [`binary_file`] names another.
    pub fn new(data_dir: &Path, exe: Option<PathBuf>) -> anyhow::Result<Self> {
        let logs = data_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        std::fs::create_dir_all(data_dir.join("binaries"))?;
        let exe = match exe {
            Some(exe) => std::fs::canonicalize(&exe)
                .map_err(|e| anyhow::anyhow!("--process-binary {}: {e}", exe.display()))?,
            None => std::env::current_exe()?,
        };
        Ok(Self {
            exe,
            data_dir: data_dir.to_path_buf(),
            logs,
            children: Vec::new(),
        })
    }

    fn spawn(&self, spec: &Spec) -> anyhow::Result<Child> {
        spawn(
            &exe_of(&self.exe, &self.data_dir, &spec.name),
            &self.logs,
            spec,
        )
    }

    pub fn start(&mut self, spec: Spec) -> anyhow::Result<()> {
        let child = self.spawn(&spec)?;
        self.children.push(Running {
            spec,
            program: None,
            child,
            restarts: 0,
            started: Instant::now(),
            held: false,
        });
        Ok(())
    }

    /// Starts `program` (from PATH) as a supervised child.
    pub fn start_command(
        &mut self,
        name: &str,
        program: &str,
        args: Vec<String>,
    ) -> anyhow::Result<()> {
        let spec = Spec {
            name: name.into(),
            args,
        };
        let child = spawn(Path::new(program), &self.logs, &spec)
            .map_err(|e| anyhow::anyhow!("cannot start {program}: {e}"))?;
        self.children.push(Running {
            spec,
            program: Some(External {
                program: program.into(),
            }),
            child,
            restarts: 0,
            started: Instant::now(),
            held: false,
        });
        Ok(())
    }

    /// Restarts children that exited; returns what happened, for printing.
    pub fn check(&mut self) -> Vec<String> {
        let mut report = Vec::new();
        for running in &mut self.children {
            if let Ok(Some(status)) = running.child.try_wait() {
                if held_file(&self.data_dir, &running.spec.name).exists() {
                    if !running.held {
                        running.held = true;
                        report.push(format!(
                            "{} exited ({status}); held down",
                            running.spec.name
                        ));
                    }
                    continue;
                }
                running.held = false;
                // Back off a child that keeps dying right after start.
                if running.started.elapsed() < Duration::from_secs(2) && running.restarts > 3 {
                    continue;
                }
                report.push(format!(
                    "{} exited ({status}); restarting (see logs/{}.log)",
                    running.spec.name,
                    running.spec.name.replace('/', "-")
                ));
                let exe = match &running.program {
                    Some(p) => PathBuf::from(&p.program),
                    None => exe_of(&self.exe, &self.data_dir, &running.spec.name),
                };
                match spawn(&exe, &self.logs, &running.spec) {
                    Ok(child) => {
                        running.child = child;
                        running.restarts += 1;
                        running.started = Instant::now();
                    }
                    Err(e) => report.push(format!("cannot restart {}: {e}", running.spec.name)),
                }
            }
        }
        report
    }

    pub fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .map(|r| (r.spec.name.clone(), r.child.id()))
            .collect()
    }

    /// SIGTERM in reverse start order, wait up to `grace`, then SIGKILL.
    pub fn stop_all(&mut self, grace: Duration) {
        for running in self.children.iter().rev() {
            // SAFETY: kill(2) on a pid we spawned and have not reaped.
            unsafe {
                libc::kill(running.child.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        for running in self.children.iter_mut().rev() {
            loop {
                match running.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = running.child.kill();
                        let _ = running.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        self.children.clear();
    }
}

/// The binary child `name` runs when it starts now: its [`binary_file`]'s,
/// else `default`.
fn exe_of(default: &Path, data_dir: &Path, name: &str) -> PathBuf {
    match std::fs::read_to_string(binary_file(data_dir, name)) {
        Ok(path) if !path.trim().is_empty() => PathBuf::from(path.trim()),
        _ => default.to_path_buf(),
    }
}

fn spawn(exe: &Path, logs: &Path, spec: &Spec) -> anyhow::Result<Child> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(logs.join(format!("{}.log", spec.name.replace('/', "-"))))?;
    let mut command = Command::new(exe);
    command
        .args(&spec.args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl(2) and getppid(2) are async-signal-safe; the closure
    // allocates nothing. Children are spawned from the thread that runs
    // `cellmesh dev` to its end (the death signal follows that thread).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("cellmesh dev exited"));
            }
            Ok(())
        });
    }
    Ok(command.spawn()?)
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        for running in &mut self.children {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}
