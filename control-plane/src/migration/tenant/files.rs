//! A tenant move's last phase, **files**: once the entry points at the
//! target, the move waits until the target has copied the tenant's files
//! from the source region's store (the copier starts on the first copy
//! round, so the freeze never waits for bytes). The target reports what
//! is pending and copied (`CellPeer.FileCopies`); each poll also asks it
//! for the move's copy rate. A copy that makes no progress for
//! `file_copy_stall` ends the wait: the target keeps copying in the
//! background and downloads are signed against the source until then.

use cellmesh_proto::ids::TenantId;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::FileCopiesRequest;

use super::TenantProgress;
use crate::migration::{MigrationError, Migrator};

/// How often the target is asked (each answer walks the tenant's upload
/// records).
const POLL: Duration = Duration::from_secs(1);

/// Files a move copied, and those still copying when it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilesCopied {
    pub files: u64,
    pub bytes: u64,
    pub files_pending: u64,
}

impl Migrator {
    /// Waits for the target `to` to copy `tenant`'s files in, keeping
    /// `state`'s file counts; what it copied.
    pub(super) async fn await_file_copies(
        &self,
        tenant: TenantId,
        to: &str,
        state: &mut TenantProgress,
        progress: &mut impl FnMut(&TenantProgress),
    ) -> Result<FilesCopied, MigrationError> {
        let mut last_progress = (Instant::now(), u64::MAX);
        let mut target = None;
        loop {
            let request = self.request(FileCopiesRequest {
                tenant_id: tenant.get(),
                bytes_per_sec: self.options.file_rate,
            });
            // Dialled again after a failed call: a target that restarts
            // may come back on another address.
            let peer = match &mut target {
                Some(peer) => peer,
                None => target.insert(self.peer(to).await?.0),
            };
            let copies = match peer.file_copies(request).await {
                Ok(r) => r.into_inner(),
                // A cell without the call has no files to copy.
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    return Ok(FilesCopied::default());
                }
                // The target is down or busy: it copies once it is back.
                Err(status) if last_progress.0.elapsed() < self.options.file_copy_stall => {
                    target = None;
                    tracing::debug!(%tenant, %status, "asking the target for its file copies");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Err(status) => {
                    return Err(MigrationError::Call {
                        what: "the tenant's file copies on the target".into(),
                        status,
                    });
                }
            };
            // Copied files drop out of the count once their source copy is
            // deleted: the total is the most ever seen.
            state.files_total = state
                .files_total
                .max(copies.files_pending + copies.files_copied);
            state.file_bytes_total =
                (state.file_bytes_total).max(copies.bytes_pending + copies.bytes_copied);
            state.files_copied = state.files_total - copies.files_pending;
            state.file_bytes_copied = state.file_bytes_total - copies.bytes_pending;
            state.phase = "files";
            progress(state);
            let copied = FilesCopied {
                files: state.files_copied,
                bytes: state.file_bytes_copied,
                files_pending: copies.files_pending,
            };
            if copies.files_pending == 0 {
                return Ok(copied);
            }
            if copies.bytes_pending < last_progress.1 {
                last_progress = (Instant::now(), copies.bytes_pending);
            } else if last_progress.0.elapsed() >= self.options.file_copy_stall {
                tracing::warn!(
                    %tenant,
                    pending = copies.files_pending,
                    "file copies make no progress; the target goes on copying in the background"
                );
                return Ok(copied);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
