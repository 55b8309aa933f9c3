//! Named fault-injection points for drills, compiled in only with the
//! `failpoints` feature (without it every point is a no-op the compiler
//! removes). Each cell has its own set, read from the file `failpoints` in
//! its data directory, one `name=action` per line, re-read while it runs:
//!
//! - `storage.slow_write=delay(300ms)` — every group-commit batch waits
//!   this long before its write (a slow disk);
//! - `storage.fan_out_unsynced=delay(300ms)` — the fan-out lane waits
//!   this long between a batch's write and the sync that makes it durable;
//! - `storage.fsync_error=error` — the next write fails as an fsync error
//!   would: the store refuses writes from then on and the cell reports
//!   itself unhealthy;
//! - `queue.publish=error` — the outbox relay cannot publish (a queue
//!   outage); acknowledged sends wait in the outbox;
//! - `standby.answers=error` — answers to sends are not replicated to the
//!   standbys (a failover inside the replication lag);
//! - `backfill.copy=error` — a backfill copy into this cell fails at once
//!   (an owner that cannot take it now);
//! - `tenant.list=error` — listing a tenant's conversations here fails
//!   (a cell not answering yet: a backfill or a move tries again);
//! - `migration.copy_stored=abort` — the process dies right after a copied
//!   chunk is stored, before answering (a crash between two steps of a
//!   migration's copy phase).
//! - `tiering.uploaded=abort` — the process dies after a cold segment is
//!   uploaded and read back, before its manifest entry commits;
//! - `tiering.committed=abort` — it dies right after the manifest entry
//!   (and the hot rows' deletion) committed;
//! - `fanout.read=abort` — the fan-out processor dies with a batch of
//!   events read from the queue, before any of their effects commit;
//! - `fanout.committed=abort` — it dies right after a batch's effects and
//!   queue positions committed, before it announces them to devices.
//! - `search.indexed=error` — the search indexer fails right after its
//!   index commit, before its queue position commits (its events come
//!   again).
//!
//! Removing a line (or the file) clears the point.

use std::time::Duration;

/// What a point does when reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Delay(Duration),
    Error,
    Abort,
}

/// Parses `delay(300ms)`, `error` or `abort`.
pub fn parse_action(s: &str) -> Result<Action, String> {
    let s = s.trim();
    match s {
        "error" => Ok(Action::Error),
        "abort" => Ok(Action::Abort),
        _ => {
            let inner = s
                .strip_prefix("delay(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("unknown fail point action {s:?}"))?;
            humantime::parse_duration(inner)
                .map(Action::Delay)
                .map_err(|e| format!("bad delay {inner:?}: {e}"))
        }
    }
}

/// Parses a whole fail point file.
pub fn parse(spec: &str) -> Result<Vec<(String, Action)>, String> {
    spec.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, action) = l
                .split_once('=')
                .ok_or_else(|| format!("{l:?} is not name=action"))?;
            Ok((name.trim().to_string(), parse_action(action)?))
        })
        .collect()
}

#[cfg(feature = "failpoints")]
mod active {
    use super::Action;
    use std::path::PathBuf;
    use std::sync::RwLock;
    use std::time::Duration;

    /// The active points of one cell.
    #[derive(Debug, Default)]
    pub struct FailPoints {
        points: RwLock<Vec<(String, Action)>>,
    }

    impl FailPoints {
        pub fn set(&self, points: Vec<(String, Action)>) {
            *self.points.write().expect("fail points") = points;
        }

        /// The action configured for `name`, if any.
        pub fn hit(&self, name: &str) -> Option<Action> {
            let points = self.points.read().expect("fail points");
            points.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
        }

        /// Ends the process at once (as a crash would) when `name` says
        /// `abort`.
        pub fn abort_at(&self, name: &str) {
            if self.hit(name) == Some(Action::Abort) {
                tracing::error!("fail point {name}: aborting");
                std::process::abort();
            }
        }

        /// Follows `path` until the process ends.
        pub fn watch(self: std::sync::Arc<Self>, path: PathBuf) {
            tokio::spawn(async move {
                let mut last = String::new();
                loop {
                    let now = std::fs::read_to_string(&path).unwrap_or_default();
                    if now != last {
                        match super::parse(&now) {
                            Ok(points) => {
                                tracing::warn!(?points, "fail points changed");
                                self.set(points);
                            }
                            Err(e) => tracing::error!(error = %e, "bad fail point file"),
                        }
                        last = now;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    }
}

#[cfg(not(feature = "failpoints"))]
mod active {
    use super::Action;

    /// Without the `failpoints` feature: nothing is ever injected. (A
    /// field, so both builds construct it alike: `FailPoints::default()`.)
    #[derive(Debug, Default)]
    pub struct FailPoints {
        _none: (),
    }

    impl FailPoints {
        #[inline(always)]
        pub fn hit(&self, _name: &str) -> Option<Action> {
            None
        }

        #[inline(always)]
        pub fn abort_at(&self, _name: &str) {}

        pub fn watch(self: std::sync::Arc<Self>, _path: std::path::PathBuf) {}
    }
}

pub use active::FailPoints;

/// Whether this build has fail points.
pub const ENABLED: bool = cfg!(feature = "failpoints");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_files_parse() {
        assert_eq!(
            parse("storage.slow_write=delay(250ms)\n# note\n\nqueue.publish = error\nmigration.copy_stored=abort").unwrap(),
            vec![
                ("storage.slow_write".into(), Action::Delay(Duration::from_millis(250))),
                ("queue.publish".into(), Action::Error),
                ("migration.copy_stored".into(), Action::Abort),
            ]
        );
        assert!(parse("storage.slow_write").is_err());
        assert!(parse("x=delay(soon)").is_err());
        assert!(parse("x=explode").is_err());
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_point_is_hit_only_while_set() {
        let points = FailPoints::default();
        assert_eq!(points.hit("queue.publish"), None);
        points.set(parse("queue.publish=error").unwrap());
        assert_eq!(points.hit("queue.publish"), Some(Action::Error));
        points.set(Vec::new());
        assert_eq!(points.hit("queue.publish"), None);
    }
}
