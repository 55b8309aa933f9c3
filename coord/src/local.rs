//! The host-local backend: registrations and elections between the
//! processes of one machine (`cellmesh dev`), as files in a shared
//! directory held under an exclusive `flock`. The kernel releases a lock
//! when its holder exits or is killed, so a dead holder's lease ends at
//! once and another candidate wins; a live holder never loses it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::{CoordError, Coordination, Lease};

#[derive(Clone)]
pub struct LocalCoordination {
    dir: PathBuf,
}

/// The subdirectory of durable records (one file per key).
const RECORDS: &str = "records";

fn store(e: impl std::fmt::Display) -> CoordError {
    CoordError::Store(e.to_string())
}

/// Keys contain `/`; file names cannot.
fn encode(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

fn decode(name: &str) -> String {
    name.replace("%2F", "/").replace("%25", "%")
}

impl LocalCoordination {
    pub fn open(dir: &Path) -> Result<Self, CoordError> {
        std::fs::create_dir_all(dir).map_err(store)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn file(&self, key: &str) -> Result<File, CoordError> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(encode(key)))
            .map_err(store)
    }

    /// Takes `key`'s lock without waiting and writes `value`; `None` while
    /// a live holder has it.
    fn try_hold(&self, key: &str, value: &str) -> Result<Option<Lease>, CoordError> {
        let mut file = self.file(key)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(store(e)),
        }
        file.set_len(0).map_err(store)?;
        file.rewind().map_err(store)?;
        file.write_all(value.as_bytes()).map_err(store)?;
        file.sync_data().map_err(store)?;
        let (guard, dropped) = oneshot::channel::<()>();
        let (held, lost) = watch::channel(false);
        tokio::spawn(async move {
            // The lock lasts as long as this process and the guard.
            let _held = held;
            let _ = dropped.await;
            drop(file);
        });
        Ok(Some(Lease {
            lost,
            _guard: guard,
        }))
    }

    /// Serializes writers of records across the host's processes (held
    /// until dropped).
    fn records_lock(&self) -> Result<File, CoordError> {
        let dir = self.dir.join(RECORDS);
        std::fs::create_dir_all(&dir).map_err(store)?;
        let file = File::create(dir.join(".lock")).map_err(store)?;
        file.lock().map_err(store)?;
        Ok(file)
    }

    /// Replaces `key`'s record atomically and durably (write, fsync,
    /// rename, fsync the directory).
    fn write_record(&self, key: &str, value: &str) -> Result<(), CoordError> {
        let dir = self.dir.join(RECORDS);
        let path = dir.join(encode(key));
        let tmp = dir.join(format!(".{}.tmp", encode(key)));
        let mut file = File::create(&tmp).map_err(store)?;
        file.write_all(value.as_bytes()).map_err(store)?;
        file.sync_all().map_err(store)?;
        std::fs::rename(&tmp, &path).map_err(store)?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(store)?;
        Ok(())
    }

    /// `key`'s value if a live holder has it locked.
    fn held(&self, path: &Path) -> Result<Option<String>, CoordError> {
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(store(e)),
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(None),
            Err(TryLockError::WouldBlock) => {
                let mut value = String::new();
                file.read_to_string(&mut value).map_err(store)?;
                Ok(Some(value))
            }
            Err(TryLockError::Error(e)) => Err(store(e)),
        }
    }
}

#[tonic::async_trait]
impl Coordination for LocalCoordination {
    async fn put(&self, key: &str, value: &str) -> Result<(), CoordError> {
        let _lock = self.records_lock()?;
        self.write_record(key, value)
    }

    async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
    ) -> Result<bool, CoordError> {
        let _lock = self.records_lock()?;
        let path = self.dir.join(RECORDS).join(encode(key));
        let current = match std::fs::read_to_string(&path) {
            Ok(v) => Some(v),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(store(e)),
        };
        if current.as_deref() != expected {
            return Ok(false);
        }
        self.write_record(key, value)?;
        Ok(true)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, CoordError> {
        let _lock = self.records_lock()?;
        let dir = self.dir.join(RECORDS);
        let path = dir.join(encode(key));
        match std::fs::read_to_string(&path) {
            Ok(current) if current == expected => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(store(e)),
        }
        std::fs::remove_file(&path).map_err(store)?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(store)?;
        Ok(true)
    }

    async fn records(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let dir = self.dir.join(RECORDS);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(store(e)),
        };
        let mut out = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(store)?;
            let name = entry.file_name().to_string_lossy().to_string();
            let key = decode(&name);
            if name.starts_with('.') || !key.starts_with(prefix) {
                continue;
            }
            let value = std::fs::read_to_string(entry.path()).map_err(store)?;
            out.insert(key, value);
        }
        Ok(out)
    }

    async fn register(&self, key: &str, value: &str, _ttl: Duration) -> Result<Lease, CoordError> {
        self.try_hold(key, value)?
            .ok_or_else(|| CoordError::Store(format!("{key} is held by another live process")))
    }

    async fn list(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir).map_err(store)? {
            let entry = entry.map_err(store)?;
            let key = decode(&entry.file_name().to_string_lossy());
            if key.starts_with(prefix)
                && let Some(value) = self.held(&entry.path())?
            {
                out.insert(key, value);
            }
        }
        Ok(out)
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        _ttl: Duration,
    ) -> Result<Lease, CoordError> {
        loop {
            if let Some(lease) = self.try_hold(election, candidate)? {
                return Ok(lease);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError> {
        self.held(&self.dir.join(encode(election)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CELLS_PREFIX, CONTROL_PLANE_ELECTION};

    #[tokio::test]
    async fn locks_are_leases_across_handles_and_end_with_their_holder() {
        let dir = std::env::temp_dir().join(format!("cellmesh-local-coord-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Two handles on one directory stand for two processes: flock locks
        // belong to open files, not to the process.
        let (a, b) = (
            LocalCoordination::open(&dir).unwrap(),
            LocalCoordination::open(&dir).unwrap(),
        );
        let ttl = Duration::from_secs(1);
        let key = format!("{CELLS_PREFIX}eu/c1");
        let registered = a.register(&key, "http://a", ttl).await.unwrap();
        assert!(b.register(&key, "http://b", ttl).await.is_err());
        assert_eq!(
            b.list(CELLS_PREFIX).await.unwrap(),
            BTreeMap::from([(key.clone(), "http://a".to_string())])
        );
        drop(registered);
        tokio::time::timeout(Duration::from_secs(2), async {
            while !b.list(CELLS_PREFIX).await.unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a dropped registration disappears");

        let first = a
            .campaign(CONTROL_PLANE_ELECTION, "one", ttl)
            .await
            .unwrap();
        assert_eq!(
            b.leader(CONTROL_PLANE_ELECTION).await.unwrap().as_deref(),
            Some("one")
        );
        let second = tokio::spawn({
            let b = b.clone();
            async move { b.campaign(CONTROL_PLANE_ELECTION, "two", ttl).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "only one leader at a time");
        drop(first);
        let _second = tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .expect("the standby wins once the leader lets go")
            .unwrap()
            .unwrap();
        assert_eq!(
            a.leader(CONTROL_PLANE_ELECTION).await.unwrap().as_deref(),
            Some("two")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_record_is_deleted_only_while_it_still_holds_what_was_read() {
        let dir =
            std::env::temp_dir().join(format!("cellmesh-local-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (a, b) = (
            LocalCoordination::open(&dir).unwrap(),
            LocalCoordination::open(&dir).unwrap(),
        );
        a.put("ops/1", "old").await.unwrap();
        assert!(
            b.compare_and_put("ops/1", Some("old"), "new")
                .await
                .unwrap()
        );
        assert!(
            !a.compare_and_delete("ops/1", "old").await.unwrap(),
            "changed meanwhile"
        );
        assert!(
            !a.compare_and_delete("ops/2", "old").await.unwrap(),
            "never written"
        );
        assert!(a.compare_and_delete("ops/1", "new").await.unwrap());
        assert!(b.records("ops/").await.unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
