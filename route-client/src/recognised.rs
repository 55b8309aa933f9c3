//! Route writes that survive a lost answer. The client tries a write again
//! when an attempt is not answered in time or its connection drops; when
//! that attempt had committed, the retry finds the entry moved on by this
//! very write and is refused (STALE_EPOCH, or a transition that is illegal
//! from the state the write left). Such a write is recognised by the entry
//! it left: read through the leader, past the epoch the write expected, in
//! the state its caller wanted. Placing a new tenant is the write every
//! deployment starts with; it is recognised the same way, and so is a
//! cell's record of who holds its high-water marks (read from the table
//! as the leader has it).

use std::time::Duration;

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1 as pb;
use tonic::Status;

use crate::client::RouteClient;
use crate::convert::entry_from_pb;
use crate::table::{Entry, Key, RouteState};

/// How often the entry a refused write left is read before the refusal
/// stands (200 ms, doubled each time: about 3 s): under the load that
/// delayed the write, the read may time out as well.
const LOST_ANSWER_READS: u32 = 4;

impl RouteClient {
    /// Applies `command`, a write of `key`'s entry expecting `expect_epoch`;
    /// the epoch it left. A refusal as stale or illegal is taken for this
    /// write's own lost answer when the entry read through the leader is
    /// past `expect_epoch` and `own` holds for it; otherwise the refusal
    /// is returned.
    pub async fn apply_recognised(
        &self,
        command: pb::RouteCommand,
        key: &Key,
        expect_epoch: u64,
        own: impl Fn(&Entry) -> bool,
    ) -> Result<u64, Status> {
        self.apply_recognised_by(command, &key.to_string(), || async {
            let entry = self.current_entry(key).await?;
            Ok(entry
                .filter(|e| e.key == *key && e.epoch > expect_epoch && own(e))
                .map(|e| e.epoch))
        })
        .await
    }

    /// Records `holders` as the cells holding a complete copy of `cell`'s
    /// high-water marks, expecting the cell's entry at `expect_epoch`; the
    /// entry's new epoch. A refusal is taken for this write's own lost
    /// answer when the leader's table has the cell past `expect_epoch`
    /// with exactly these holders.
    pub async fn set_mark_holders(
        &self,
        cell: &str,
        holders: Vec<String>,
        expect_epoch: u64,
    ) -> Result<u64, Status> {
        let mut wanted = holders.clone();
        wanted.sort();
        wanted.dedup();
        let command = crate::commands::set_mark_holders(cell, holders, expect_epoch);
        self.apply_recognised_by(command, &format!("cell {cell}"), || async {
            self.catch_up().await?;
            Ok(self.read(|t| {
                t.cell(cell)
                    .filter(|c| c.epoch > expect_epoch && c.mark_holders == wanted)
                    .map(|c| c.epoch)
            }))
        })
        .await
    }

    /// Applies `command`; the epoch it left. A refusal as stale or illegal
    /// stands unless `recognise` (a read through the leader) finds what
    /// this write leaves and answers its epoch; a read that fails is tried
    /// again a few times.
    async fn apply_recognised_by<F, R>(
        &self,
        command: pb::RouteCommand,
        what: &str,
        recognise: F,
    ) -> Result<u64, Status>
    where
        F: Fn() -> R,
        R: std::future::Future<Output = Result<Option<u64>, Status>>,
    {
        let refusal = match self.apply(command).await {
            Ok(applied) => return Ok(applied.index),
            Err(status) => status,
        };
        if !matches!(
            error_detail(&refusal).known_reason(),
            Some(Reason::StaleEpoch | Reason::IllegalTransition)
        ) {
            return Err(refusal);
        }
        for attempt in 0..LOST_ANSWER_READS {
            match recognise().await {
                Ok(Some(epoch)) => return Ok(epoch),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%what, error = %e.message(), "reading what a write left: trying again");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
        Err(refusal)
    }

    /// Places a new `tenant` on `cell`; the epoch of its entry. A tenant
    /// already on `cell` counts as placed (this write's own answer may have
    /// been lost); one placed elsewhere is refused (STALE_EPOCH).
    pub async fn place_tenant(&self, tenant: TenantId, cell: &str) -> Result<u64, Status> {
        let command = crate::commands::assign_tenant(tenant, cell, 0);
        let key = Key::tenant(tenant);
        self.apply_recognised(command, &key, 0, |e| placed(e, cell))
            .await
    }

    /// The entry `key` resolves to (its own, else its tenant's), read
    /// through the leader; None when there is none.
    pub async fn current_entry(&self, key: &Key) -> Result<Option<Entry>, Status> {
        match self.resolve_linearizable(key).await {
            Ok(resolved) => resolved.entry.map(entry_from_pb).transpose(),
            Err(status) if error_detail(&status).known_reason() == Some(Reason::NoRoute) => {
                Ok(None)
            }
            Err(status) => Err(status),
        }
    }
}

/// Whether `entry` is a tenant's entry as placing it on `cell` left it.
fn placed(entry: &Entry, cell: &str) -> bool {
    entry.cell == cell && entry.state == RouteState::Active && entry.failed_from.is_none()
}
