//! The fan-out's threads ahead of the rest of the cell. The fan-out
//! processor and the fan-out's commit lane are one thread each, and every
//! push waits behind both in turn, while the gRPC runtime's workers serve
//! thousands of streams at once. With the cores busy, the kernel's fair
//! share lets the workers' bursts of pushes hold those two threads off a
//! core, and every message behind them waits; a lower nice
//! (`storage.fanout_nice`, per thread on Linux) gives them a core first.
//! They do a bounded amount of work per batch, so they cannot starve the
//! workers. (The message lane keeps the process's nice: sends measured
//! slower with it raised.) Lowering a nice takes
//! `CAP_SYS_NICE` or a large enough `RLIMIT_NICE` (systemd's `LimitNICE=`);
//! without either the threads keep the process's nice, and the cell says
//! so once.

use std::sync::atomic::{AtomicBool, Ordering};

/// What [`set_this_thread`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The thread now runs at the asked nice.
    Set,
    /// 0 asked: the thread keeps the process's nice.
    Unchanged,
    /// The process may not lower its nice that far (or this is not Linux).
    NotPermitted,
}

/// Gives the calling thread `nice` (-20 to 19; 0 leaves it alone). A
/// refusal is logged once per process, naming `thread`, and otherwise
/// ignored: the cell runs as before.
pub fn set_this_thread(nice: i32, thread: &str) -> Applied {
    if nice == 0 {
        return Applied::Unchanged;
    }
    match set(nice) {
        Ok(()) => Applied::Set,
        Err(error) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    thread,
                    nice,
                    %error,
                    "the fan-out's threads keep the process's priority \
                     (storage.fanout_nice needs CAP_SYS_NICE or RLIMIT_NICE)"
                );
            }
            Applied::NotPermitted
        }
    }
}

#[cfg(target_os = "linux")]
fn set(nice: i32) -> std::io::Result<()> {
    // SAFETY: plain system calls on this thread's own id.
    let done = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    match done {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(not(target_os = "linux"))]
fn set(_nice: i32) -> std::io::Result<()> {
    Err(std::io::Error::other(
        "per-thread priorities are Linux only",
    ))
}

/// The nice of this process's thread named `name` (the first such), read
/// from `/proc` (what the tests check).
#[cfg(target_os = "linux")]
pub fn nice_of_thread(name: &str) -> Option<i32> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        // Field 19 of proc(5); the command before it may hold spaces.
        let stat = std::fs::read_to_string(path.join("stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        return rest.split_whitespace().nth(19 - 3)?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process may lower a thread's nice at all (a probe on
    /// a thread of its own).
    fn may_lower() -> bool {
        std::thread::spawn(|| set(nice_now() - 1).is_ok())
            .join()
            .unwrap()
    }

    /// The calling thread's nice.
    fn nice_now() -> i32 {
        // SAFETY: reads this thread's own priority.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_thread_gets_the_nice_asked_or_keeps_its_own_when_refused() {
        let lowering = may_lower();
        let (applied, seen) = std::thread::Builder::new()
            .name("nice-probe".into())
            .spawn(|| {
                let applied = set_this_thread(-3, "nice-probe");
                (applied, nice_of_thread("nice-probe"))
            })
            .unwrap()
            .join()
            .unwrap();
        if lowering {
            assert_eq!((applied, seen), (Applied::Set, Some(-3)));
        } else {
            assert_eq!(applied, Applied::NotPermitted);
            assert_ne!(seen, Some(-3));
        }
        // Raising a nice is always allowed; 0 changes nothing; the
        // calling thread is the only one changed.
        let own = nice_now();
        let (asked, got) = std::thread::spawn(|| {
            assert_eq!(set_this_thread(0, "test"), Applied::Unchanged);
            let before = nice_now();
            let higher = (before.max(0) + 1).min(19);
            assert_eq!(set_this_thread(higher, "test"), Applied::Set);
            (higher, nice_now())
        })
        .join()
        .unwrap();
        assert_eq!(got, asked);
        assert_eq!(nice_now(), own);
    }
}
