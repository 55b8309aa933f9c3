//! Moving one user's home from cell A to cell B: the user's sync queue (by
//! pts, each event with its message), conversation list, mute flags and
//! device cursors go through the same phases as a conversation's history.
//! While the home is frozen, events for the user wait in their senders'
//! forward queues; after the switch they go to B, which goes on at A's
//! pts, so devices reconnect and continue from their cursors.

use cellmesh_proto::ids::{TenantId, UserId};
use std::time::Instant;

use cellmesh_proto::v1::{
    CopyResponse, CopyUserRequest, DigestResponse, SealRequest, UserDigestRequest,
};
use cellmesh_route_client::table::Key;

use super::protocol::Subject;
use super::{Ends, MigrationError, Migrator, Progress, Start, both, call};

#[derive(Debug, Clone)]
pub struct UserMoveReport {
    pub tenant: TenantId,
    pub user: u64,
    pub from: String,
    pub to: String,
    /// The source's last pts; the target appends above it.
    pub final_pts: u64,
    pub events_verified: u64,
    pub frozen_for: std::time::Duration,
    pub total: std::time::Duration,
    pub switch_epoch: u64,
}

impl Migrator {
    /// Moves the home of `user` of `tenant` to cell `to`, or resumes a move
    /// that was interrupted.
    pub async fn migrate_user(
        &self,
        tenant: TenantId,
        user: UserId,
        to: &str,
        mut progress: impl FnMut(&Progress),
    ) -> Result<UserMoveReport, MigrationError> {
        let started = Instant::now();
        let key = Key::user(tenant, user);
        let (state, start, ends) = self.open_move(&key, to).await?;
        let from = ends.from.clone();
        let mut subject = UserMove {
            migrator: self,
            tenant: tenant.get(),
            user: user.get(),
            ends,
            reset: false,
        };
        let moved = self
            .run_move(&key, &state, start, &mut subject, to, &mut progress)
            .await?;
        Ok(UserMoveReport {
            tenant,
            user: user.get(),
            from,
            to: to.to_string(),
            final_pts: moved.final_position,
            events_verified: moved.verified,
            frozen_for: moved.frozen_for,
            total: started.elapsed(),
            switch_epoch: moved.switch_epoch,
        })
    }
}

/// A user's home on the move.
struct UserMove<'a> {
    migrator: &'a Migrator,
    tenant: u64,
    user: u64,
    ends: Ends,
    /// The next copy starts the target's copy afresh.
    reset: bool,
}

impl UserMove<'_> {
    fn digest(&self, after: u64, through: u64) -> UserDigestRequest {
        UserDigestRequest {
            tenant_id: self.tenant,
            user_id: self.user,
            after_seq: after,
            through_seq: through,
        }
    }
}

impl Subject for UserMove<'_> {
    const EXACT_LATEST: bool = true;

    async fn resume_point(&mut self, start: &Start) -> Result<u64, MigrationError> {
        // A target may hold an older queue of this user (a home it had
        // before a failover): keep what it holds only if it is a prefix of
        // the source's.
        let target = self
            .ends
            .target
            .user_digest(self.migrator.request(self.digest(0, 0)))
            .await
            .map_err(call("target digest"))?
            .into_inner()
            .latest_seq;
        if start.began || target == 0 {
            self.reset = true;
            return Ok(0);
        }
        let (a, b) = self.digests(0, target).await?;
        if (a.count, a.checksum) != (b.count, b.checksum) || a.latest_seq < target {
            self.reset = true;
            return Ok(0);
        }
        Ok(target)
    }

    async fn copy(&mut self, after: u64) -> Result<CopyResponse, MigrationError> {
        let copy = CopyUserRequest {
            source_address: self.ends.source_address.clone(),
            tenant_id: self.tenant,
            user_id: self.user,
            after_pts: after,
            chunk: self.migrator.options.chunk,
            reset: std::mem::take(&mut self.reset),
            source_cell: self.ends.from.clone(),
        };
        Ok(self
            .ends
            .target
            .copy_user(self.migrator.request(copy))
            .await
            .map_err(call("copy"))?
            .into_inner())
    }

    async fn digests(
        &mut self,
        after: u64,
        through: u64,
    ) -> Result<(DigestResponse, DigestResponse), MigrationError> {
        let (m, digest) = (self.migrator, self.digest(after, through));
        let (source, target) = (&mut self.ends.source, &mut self.ends.target);
        let (a, b) = tokio::join!(
            source.user_digest(m.request(digest)),
            target.user_digest(m.request(digest))
        );
        both(a, b)
    }

    async fn seal(&mut self, epoch: u64, copied: u64) -> Result<(u64, u64), MigrationError> {
        let seal = SealRequest {
            tenant_id: self.tenant,
            user_id: self.user,
            epoch,
            ..Default::default()
        };
        let sealed = self
            .ends
            .source
            .seal_user(self.migrator.request(seal))
            .await
            .map_err(call("seal the source"))?
            .into_inner();
        Ok((sealed.latest_seq, copied))
    }

    fn switch_floor(&self, _final_position: u64) -> u64 {
        0
    }
}
