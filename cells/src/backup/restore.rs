//! Restoring a cell's database from a backup, offline, before the cell
//! starts: the files are downloaded and checked into `<data_dir>/db`
//! (which must not hold a database), then the database is made safe to
//! serve. Seq never goes back: each conversation resumes above the
//! highest seq its owner may have assigned — the mark a standby holds
//! (from the route table's holders, when one answers) plus the failover
//! safety margin, or, when no holder answers, the backup's latest seq plus
//! the most the conversation could have taken since the backup at its
//! rate limit. Every user's sync queue gets a new identity, so that
//! devices rebase instead of waiting for pts they had already passed.

use std::collections::HashMap;

use super::{BackupError, Backups, Manifest, Result};
use crate::config::CellConfig;
use crate::storage::Store;

/// What a restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub backup: String,
    pub from_cell: String,
    pub files: usize,
    pub bytes: u64,
    pub conversations: usize,
    /// The largest number of seqs a conversation skipped.
    pub widest_skip: u64,
    /// Whether the floors came from standbys' marks (else from time).
    pub marks_from_standbys: bool,
    pub users_rebased: usize,
}

/// Held marks by conversation (from the standbys of the backed-up cell);
/// `None`: no standby answered.
pub type HeldMarks = Option<HashMap<u64, u64>>;

/// Restores backup `id` (empty: the latest) of cell `from` into the
/// database directory of `config`.
pub async fn restore(
    config: &CellConfig,
    from: &str,
    id: &str,
    held: HeldMarks,
    now_ms: u64,
) -> Result<Restored> {
    let db_dir = config.data_dir.join("db");
    let occupied = std::fs::read_dir(&db_dir).is_ok_and(|mut d| d.next().is_some());
    if occupied {
        return Err(BackupError::Io(format!(
            "{} already holds a database: a restore never overwrites one (move it away first)",
            db_dir.display()
        )));
    }
    let backups = Backups::open(&config.backup, from, &config.data_dir)?;
    let manifest = backups.manifest(id).await?;
    let staging = config.data_dir.join("db.restoring");
    let _ = std::fs::remove_dir_all(&staging);
    let (problems, bytes) = backups.download(&manifest, &staging).await?;
    if !problems.is_empty() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(BackupError::Io(format!(
            "backup {} is damaged: {}",
            manifest.id,
            problems.join("; ")
        )));
    }
    let _ = std::fs::remove_dir(&db_dir);
    std::fs::rename(&staging, &db_dir).map_err(|e| BackupError::Io(e.to_string()))?;
    let db = Store::open(&db_dir, &config.storage)?;
    let resumed = resume(&db, config, &manifest, &held, now_ms);
    db.close();
    let (conversations, widest_skip, users_rebased) = resumed?;
    Ok(Restored {
        backup: manifest.id.clone(),
        from_cell: from.to_string(),
        files: manifest.files.len(),
        bytes,
        conversations,
        widest_skip,
        marks_from_standbys: held.is_some(),
        users_rebased,
    })
}

/// The margin above a conversation's last known seq: the failover margin,
/// and without a standby's mark also what the conversation may have taken
/// since the backup at its rate limit.
pub fn margin(config: &CellConfig, since_backup_ms: Option<u64>) -> u64 {
    let per_sec = u64::from(config.rate_limit.conversation_per_sec);
    let base = cellmesh_route_client::table::safety_margin(
        per_sec,
        u64::from(config.rate_limit.conversation_burst),
        config.routing.checkpoint_interval_ms,
    );
    base + since_backup_ms.map_or(0, |ms| (per_sec * ms).div_ceil(1000))
}

fn resume(
    db: &Store,
    config: &CellConfig,
    manifest: &Manifest,
    held: &HeldMarks,
    now_ms: u64,
) -> Result<(usize, u64, usize)> {
    let since = held
        .is_none()
        .then(|| now_ms.saturating_sub(manifest.created_ms));
    let margin = margin(config, since);
    let mut floors = Vec::new();
    let mut widest = 0;
    let mut after = 0;
    loop {
        let page = db.conversation_marks(after, 4096)?;
        let Some(&(_, last, _)) = page.last() else {
            break;
        };
        after = last;
        for (_, conversation, latest) in page {
            let mark = held
                .as_ref()
                .and_then(|h| h.get(&conversation).copied())
                .unwrap_or(0);
            let floor = latest.max(mark) + margin;
            widest = widest.max(floor - latest);
            floors.push((conversation, floor));
        }
    }
    let queues: Vec<_> = db
        .queues()?
        .into_iter()
        .map(|(tenant, user, old)| (tenant, user, fresh_queue_id(old)))
        .collect();
    db.resume_restored(&floors, &queues)?;
    Ok((floors.len(), widest, queues.len()))
}

fn fresh_queue_id(old: u64) -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 && id != old {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_standby_the_margin_covers_what_the_rate_allows_since_the_backup() {
        let mut config = CellConfig::default();
        config.rate_limit.conversation_per_sec = 100;
        config.rate_limit.conversation_burst = 50;
        config.routing.checkpoint_interval_ms = 1000;
        // The failover margin: the burst and two checkpoint intervals.
        assert_eq!(margin(&config, None), 50 + 200);
        // An hour and a half-second later: 100/s for 3,600.5 s more.
        assert_eq!(margin(&config, Some(3_600_500)), 250 + 360_050);
    }

    #[test]
    fn a_fresh_queue_id_is_never_zero_or_the_old_one() {
        for old in [0, 1, u64::MAX] {
            let id = fresh_queue_id(old);
            assert!(id != 0 && id != old);
        }
    }
}
