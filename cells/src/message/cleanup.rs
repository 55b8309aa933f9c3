//! Cleanup after a move (DESIGN.md §5, step 6): a cell marks each
//! conversation or user home it seals for a move; once the key has been
//! owned elsewhere for the grace period, its copy here is dropped (a
//! conversation's history — record and members stay, they may be a
//! standby's copy — or a user's sync state). A move that was cancelled, or
//! came back, keeps it.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use std::time::Duration;

use cellmesh_proto::v1::RouteState;

use super::MessageService;
use crate::error::{CellError, Result};
use crate::storage::moved::{self, Moved};
use crate::storage::{Mutation, Store};

/// What the route table says about a key this cell handed over.
pub(crate) enum Handed {
    /// It is this cell's again: keep the copy, forget the mark.
    Back,
    /// Another cell owns it and is not moving it here: the copy may go.
    Away,
    /// Frozen, moving, or the route cannot be read now: ask again later.
    Unsettled,
}

impl Handed {
    /// From an ownership or home check of the key.
    pub(crate) fn of<T>(check: Result<T>) -> Self {
        match check {
            Ok(_) => Self::Back,
            Err(CellError::WrongCell { route, .. }) if route.state == RouteState::Active as i32 => {
                Self::Away
            }
            Err(_) => Self::Unsettled,
        }
    }
}

/// Records that key `id` of `kind` (see [`moved`]) was sealed here at
/// `now_ms`.
pub(crate) async fn mark_sealed(
    store: &Store,
    kind: u8,
    tenant: TenantId,
    id: u64,
    now_ms: u64,
) -> Result<()> {
    mark_all_sealed(store, kind, tenant, &[id], now_ms).await
}

/// [`mark_sealed`] for many keys of one tenant, in one commit.
pub(crate) async fn mark_all_sealed(
    store: &Store,
    kind: u8,
    tenant: TenantId,
    ids: &[u64],
    sealed_at_ms: u64,
) -> Result<()> {
    let mut m = Mutation::new();
    for &id in ids {
        m.mark_moved(
            kind,
            Moved {
                id,
                tenant,
                sealed_at_ms,
            },
        );
    }
    store.commit(m).await?;
    store.note_handover();
    Ok(())
}

/// What [`clean`] does with a key that came back (`back`) and with the copy
/// of one owned elsewhere for the grace period (`drop`).
pub(crate) struct Cleanup<B, D> {
    pub back: B,
    pub drop: D,
}

/// Goes through the keys of `kind` this cell handed over: forgets those
/// `handed` says came back (after `back`), and drops (with `drop`) the copy
/// of those owned elsewhere for `grace`; the keys dropped.
pub(crate) async fn clean<B, D>(
    store: &Store,
    kind: u8,
    now_ms: u64,
    grace: Duration,
    handed: impl Fn(&Moved) -> Handed,
    on: Cleanup<B, D>,
) -> Result<Vec<Moved>>
where
    B: Fn(&mut Mutation, &Moved) -> Result<()>,
    D: Fn(&mut Mutation, &Moved) -> Result<()>,
{
    let mut dropped = Vec::new();
    for moved in store.moved(kind)? {
        let expired = now_ms >= moved.sealed_at_ms + grace.as_millis() as u64;
        let mut m = Mutation::new();
        match handed(&moved) {
            Handed::Back => (on.back)(&mut m, &moved)?,
            Handed::Away if expired => {
                (on.drop)(&mut m, &moved)?;
                dropped.push(moved);
            }
            Handed::Away | Handed::Unsettled => continue,
        }
        m.unmark_moved(kind, moved.tenant, moved.id);
        store.commit(m).await?;
    }
    Ok(dropped)
}

impl MessageService {
    /// Records that `conversation` was sealed here for a move.
    pub(crate) async fn mark_sealed(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<()> {
        let now = self.clock.now_ms();
        mark_sealed(
            &self.store,
            moved::CONVERSATION,
            tenant,
            (conversation).get(),
            now,
        )
        .await
    }

    /// Drops the history of conversations owned elsewhere for `grace`;
    /// how many.
    pub async fn clean_moved(&self, grace: Duration) -> Result<u64> {
        let now = self.clock.now_ms();
        let handed = |m: &Moved| {
            Handed::of(
                self.ownership
                    .check(m.tenant, ConversationId(m.id), Epoch(0)),
            )
        };
        let dropped = clean(
            &self.store,
            moved::CONVERSATION,
            now,
            grace,
            handed,
            Cleanup {
                back: |_: &mut Mutation, _: &Moved| Ok(()),
                drop: |m: &mut Mutation, moved: &Moved| {
                    // The search index forgets it too.
                    m.emit(&cellmesh_proto::storage::v1::OutboxEvent {
                        kind: cellmesh_proto::storage::v1::OutboxKind::HistoryDropped as i32,
                        tenant_id: moved.tenant.get(),
                        conversation_id: moved.id,
                        ..Default::default()
                    });
                    Ok(self.store.drop_history(m, ConversationId(moved.id))?)
                },
            },
        )
        .await?;
        for moved in &dropped {
            self.conversations.invalidate(ConversationId(moved.id));
        }
        if !dropped.is_empty() {
            let dropped = dropped.len();
            tracing::info!(dropped, "dropped the history of conversations moved away");
        }
        Ok(dropped.len() as u64)
    }
}
