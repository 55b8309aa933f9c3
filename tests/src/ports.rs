//! Fixed loopback ports for test processes that must be told a port up
//! front (etcd, moto, a `cellmesh` process, `cellmesh dev`). A port that a
//! test picked by binding port 0 and releasing it can be taken again by any
//! other test's port-0 server before the child binds it; these ports are
//! below the kernel's ephemeral range (32768+), where no port-0 bind lands,
//! and each block of them is claimed by one test process at a time through
//! a lock on a file (held until the process exits). A port is therefore
//! held for its test from the moment it is handed out until it is bound.

use std::os::fd::AsRawFd as _;
use std::sync::Mutex;
use std::sync::OnceLock;

/// One claimed block: its first port and the lock that claims it.
struct Block {
    first: u16,
    _lock: std::fs::File,
}

/// Claims one of `count` blocks of `size` ports from `start`, named
/// `kind` among the lock files; panics when every block is taken.
fn claim(kind: &str, start: u16, size: u16, count: u16) -> Block {
    let dir = std::env::temp_dir().join(format!("cellmesh-{kind}"));
    std::fs::create_dir_all(&dir).expect("a directory for port locks");
    let first = (std::process::id() % u32::from(count)) as u16;
    for slot in (0..count).map(|i| (first + i) % count) {
        let file = std::fs::File::create(dir.join(format!("{slot}.lock"))).expect("a lock file");
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Block {
                first: start + slot * size,
                _lock: file,
            };
        }
    }
    panic!("all {count} blocks of {kind} are claimed by other test processes");
}

/// The first of 130 ports this process alone uses for `cellmesh dev`
/// (90 blocks from 20000).
pub fn dev_base() -> u16 {
    static BLOCK: OnceLock<Block> = OnceLock::new();
    BLOCK
        .get_or_init(|| claim("dev-port-bases", 20_000, 130, 90))
        .first
}

/// Ports in a block of 100 of this process's own (100 blocks from 10000).
const SINGLE: u16 = 100;

/// A loopback port no other test uses and nothing is bound to: the next
/// of this process's block.
pub fn free_port() -> u16 {
    static BLOCK: OnceLock<Block> = OnceLock::new();
    static NEXT: Mutex<u16> = Mutex::new(0);
    let first = BLOCK
        .get_or_init(|| claim("ports", 10_000, SINGLE, 100))
        .first;
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    while *next < SINGLE {
        let port = first + *next;
        *next += 1;
        // A port a crashed earlier run still holds (or TIME_WAIT) is skipped.
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("this test used all {SINGLE} of its fixed ports");
}
