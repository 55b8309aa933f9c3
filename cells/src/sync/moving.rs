//! The cell's part of moving a user's home (DESIGN.md §5, for user keys).
//! As the source it exports the user's sync queue in checksummed chunks —
//! each event with its message, which may live only here — and the user's
//! conversation list, mute flags and device cursors; it seals the home
//! once the route is frozen (the processor has applied every event it took
//! before, no ack or setting is in flight) and digests the queue for
//! verification. The target stores the copy through its processor, keeping
//! the source's pts, so devices go on from their cursors after the switch.
//! The source drops its copy once the grace period after the move is over.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::time::{Duration, Instant};

use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::{
    ConvListItem, ConversationMeta, DeviceCursor, Mark, PtsRecord, SyncEventKind, UserChunk,
    UserState,
};
use prost::Message as _;
use sha2::{Digest, Sha256};

use super::SyncService;
use crate::convert::message_to_proto;
use crate::error::{CellError, Result};
use crate::message::cleanup::{self, Handed};
use crate::storage::moved::{self, Moved};
use crate::storage::walk::Walk;
use crate::user::UserKey;

/// How long a seal waits for the frozen route and the processor.
const SEAL_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_EXPORT_CHUNK: usize = 5_000;

/// A sync event's contribution to a user checksum (the embedded message is
/// left out: the source stores it by reference, the target by value).
pub fn sync_checksum(pts: u64, r: &SyncRecord) -> u64 {
    let mut h = Sha256::new();
    h.update(pts.to_be_bytes());
    h.update(r.kind.to_be_bytes());
    h.update(r.conversation_id.to_be_bytes());
    h.update(r.seq.to_be_bytes());
    h.update(r.msg_id.to_be_bytes());
    h.update(r.server_ts_ms.to_be_bytes());
    for item in &r.items {
        h.update(item.to_be_bytes());
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// See [`SyncService::digest_user`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserDigest {
    pub count: u64,
    pub checksum: u64,
    pub latest_pts: u64,
}

/// [`SyncService::digest_user`] in a [`Walk`] (many homes read in a row).
fn digest_user(walk: &mut Walk<'_>, user: UserKey, after: u64, through: u64) -> Result<UserDigest> {
    let (mut count, mut checksum) = (0u64, 0u64);
    walk.sync_events(user, after, through, |pts, r| {
        count += 1;
        checksum = checksum.wrapping_add(sync_checksum(pts, r));
    })?;
    Ok(UserDigest {
        count,
        checksum,
        latest_pts: walk.user_pts(user)?,
    })
}

/// The processor as a seal needs it: a wait until every event it took so
/// far is applied. The pipeline's `PeerInbound` is one; the sync layer does
/// not depend on the pipeline.
pub trait ProcessorBarrier: Send + Sync {
    fn barrier(&self) -> futures::future::BoxFuture<'_, std::result::Result<(), BarrierError>>;
}

/// Why the processor could not be waited for (it stopped, or failed).
pub type BarrierError = Box<dyn std::error::Error + Send + Sync>;

impl SyncService {
    /// A chunk of `user`'s sync queue after `after_pts`, or with
    /// `with_state` their conversation list, mute flags, cursors and the
    /// meta of their conversations (source side).
    pub fn export_user(
        &self,
        user: UserKey,
        after_pts: u64,
        limit: usize,
        with_state: bool,
    ) -> Result<UserChunk> {
        let latest_pts = self.store.user_pts(user)?;
        if with_state {
            return Ok(UserChunk {
                latest_pts,
                state: Some(self.user_state(user)?),
                ..Default::default()
            });
        }
        let page = self
            .store
            .sync_after(user, after_pts, limit.clamp(1, MAX_EXPORT_CHUNK))?;
        let mut checksum = 0u64;
        let mut events = Vec::with_capacity(page.len());
        for (pts, mut record) in page {
            checksum = checksum.wrapping_add(sync_checksum(pts, &record));
            let kind = SyncEventKind::try_from(record.kind).unwrap_or(SyncEventKind::Unspecified);
            if record.remote_message.is_empty()
                && matches!(
                    kind,
                    SyncEventKind::Message | SyncEventKind::Recall | SyncEventKind::Edit
                )
                && let Some(m) = self
                    .store
                    .message(ConversationId(record.conversation_id), record.seq)?
            {
                record.remote_message =
                    message_to_proto(ConversationId(record.conversation_id), record.seq, m)
                        .encode_to_vec();
            }
            events.push(PtsRecord {
                pts,
                record: Some(record),
            });
        }
        Ok(UserChunk {
            events,
            latest_pts,
            checksum,
            state: None,
        })
    }

    fn user_state(&self, user: UserKey) -> Result<UserState> {
        let mut conversations = Vec::new();
        for (id, entry) in self.store.conv_list(user)? {
            let meta = match self.store.conversation(ConversationId(id))? {
                Some(record) => Some(ConversationMeta {
                    record: Some(record),
                    members: self.store.members(ConversationId(id), 0, usize::MAX)?.0,
                }),
                None => None,
            };
            conversations.push(ConvListItem {
                conversation_id: id,
                entry: Some(entry),
                muted: self.store.muted(user, ConversationId(id))?,
                meta,
            });
        }
        let cursors = self
            .store
            .device_cursors(user)?
            .into_iter()
            .map(|(device, pts)| DeviceCursor { device, pts })
            .collect();
        Ok(UserState {
            conversations,
            cursors,
            queue_id: self.store.queue_id(user)?,
        })
    }

    /// Count and checksum of `user`'s sync events in `(after, through]`, and
    /// the latest pts.
    pub fn digest_user(&self, user: UserKey, after: u64, through: u64) -> Result<UserDigest> {
        digest_user(&mut self.store.walk(), user, after, through)
    }

    /// Once this cell has seen `user`'s home frozen at `epoch`, waits until
    /// nothing more reaches the user's queue here: the processor took every
    /// later event as held, and no ack or setting is in flight. Answers the
    /// final latest pts.
    pub async fn seal_user(
        &self,
        user: UserKey,
        epoch: u64,
        processor: &dyn ProcessorBarrier,
    ) -> Result<u64> {
        let deadline = Instant::now() + SEAL_TIMEOUT;
        self.messages.await_route_epoch(epoch, deadline).await?;
        match self.homes.check_home(user, true) {
            Err(CellError::RetryLater {
                reason: Reason::Frozen,
                ..
            }) => {}
            _ => {
                return Err(CellError::invalid(
                    Reason::NotFrozen,
                    format!("the home of {user} is not frozen here at epoch {epoch}"),
                ));
            }
        }
        self.barrier(processor, deadline).await?;
        // Acks and settings check the home under the read side.
        drop(self.user_writes.write().await);
        let now = self.clock.now_ms();
        cleanup::mark_sealed(
            &self.store,
            moved::USER,
            user.tenant,
            (user.user).get(),
            now,
        )
        .await?;
        Ok(self.store.user_pts(user)?)
    }

    /// The users of `tenant` whose homes a move takes along: the members of
    /// its `conversations` here and `extra` (members of its conversations
    /// elsewhere), in order.
    pub fn tenant_user_ids(
        &self,
        conversations: &[ConversationId],
        extra: &[UserId],
    ) -> Result<Vec<UserId>> {
        let mut users = self.messages.members_of(conversations, 0)?;
        users.extend_from_slice(extra);
        users.sort_unstable();
        users.dedup();
        Ok(users)
    }

    /// Where the queue of each of `users` of `tenant` stands here; with
    /// `digest`, the count and checksum of all of it too.
    pub fn user_marks(
        &self,
        tenant: TenantId,
        users: &[UserId],
        digest: bool,
    ) -> Result<Vec<Mark>> {
        let handed: std::collections::HashSet<u64> = self
            .store
            .moved_of_tenant(moved::USER, tenant)?
            .into_iter()
            .collect();
        // Sealed whole here, its homes not marked one by one yet.
        let tenant_sealed = !self
            .store
            .moved_of_tenant(moved::TENANT, tenant)?
            .is_empty();
        let mut walk = self.store.walk();
        let mut sorted = users.to_vec();
        sorted.sort_unstable();
        sorted
            .iter()
            .map(|&id| {
                let user = UserKey::new(tenant, id);
                let latest = walk.user_pts(user)?;
                let (count, checksum) = if digest {
                    let d = digest_user(&mut walk, user, 0, latest)?;
                    (d.count, d.checksum)
                } else {
                    (0, 0)
                };
                Ok(Mark {
                    id: id.get(),
                    latest,
                    rewrites: 0,
                    count,
                    checksum,
                    handed_over: tenant_sealed || handed.contains(&id.get()),
                    uploads: 0,
                })
            })
            .collect()
    }

    /// Seals, as [`SyncService::seal_user`] does one, the homes among
    /// `users` of `tenant` that this cell sees frozen at `epoch`, each
    /// marked for cleanup.
    pub async fn seal_tenant_users(
        &self,
        tenant: TenantId,
        users: &[UserId],
        epoch: u64,
        processor: &dyn ProcessorBarrier,
    ) -> Result<u64> {
        self.seal_tenant_homes(epoch, processor).await?;
        let frozen: Vec<u64> = users
            .iter()
            .copied()
            .filter(|&u| {
                matches!(
                    self.homes.check_home(UserKey::new(tenant, u), true),
                    Err(CellError::RetryLater {
                        reason: Reason::Frozen,
                        ..
                    })
                )
            })
            .map(UserId::get)
            .collect();
        let now = self.clock.now_ms();
        cleanup::mark_all_sealed(&self.store, moved::USER, tenant, &frozen, now).await?;
        Ok(frozen.len() as u64)
    }

    /// Once this cell has seen route epoch `epoch` (a tenant's freeze):
    /// one processor barrier and one wait for in-flight acks and settings
    /// for every home here.
    pub async fn seal_tenant_homes(
        &self,
        epoch: u64,
        processor: &dyn ProcessorBarrier,
    ) -> Result<()> {
        let deadline = Instant::now() + SEAL_TIMEOUT;
        self.messages.await_route_epoch(epoch, deadline).await?;
        self.barrier(processor, deadline).await?;
        drop(self.user_writes.write().await);
        Ok(())
    }

    /// Marks, for cleanup after the grace period, each conversation and
    /// home of the tenants sealed whole here (one mark each at the seal)
    /// that this cell no longer owns or sees frozen; how many tenants.
    /// Runs after a tenant's seal, off its freeze, and at start for marks
    /// a restart left.
    pub async fn expand_sealed_tenants(self: &std::sync::Arc<Self>) -> Result<u64> {
        let this = self.clone();
        // Whole-tenant scans: off the request threads.
        let marks = crate::error::blocking(move || this.sealed_tenant_marks()).await?;
        let tenants = marks.len() as u64;
        for m in marks {
            self.store.commit(m).await?;
        }
        Ok(tenants)
    }

    /// Starts `user`'s queue anew before a device is answered from it, if
    /// its home is here again other than by a move back (a failover onto
    /// the cell it had moved away from): the copy left here lacks what the
    /// home appended elsewhere, and its old queue id must not be handed to
    /// a device with an older latest pts. The processor does the same with
    /// the user's next event; whichever comes first restarts the queue,
    /// the other finds it current. A move exports the home's state only
    /// after this, so the old id does not travel on either. Nothing is read
    /// while this cell never handed a home over.
    pub(crate) async fn settle_home(&self, user: UserKey) -> Result<()> {
        if self.store.handovers() == 0 || !self.store.home_is_stale(user)? {
            return Ok(());
        }
        let _writing = self.user_writes.read().await;
        if self.homes.check_home(user, true).is_err() || !self.store.home_is_stale(user)? {
            return Ok(());
        }
        tracing::info!(tenant = %user.tenant, user = %user.user, "a home back without a move: its queue starts anew before a device is answered");
        let mut m = crate::storage::Mutation::new();
        m.restart_queue(user, self.clock.now_ms());
        self.store.commit(m).await?;
        Ok(())
    }

    /// For each tenant sealed whole here, the marks of its keys this cell
    /// no longer owns or sees frozen, and the removal of the tenant's mark.
    fn sealed_tenant_marks(&self) -> Result<Vec<crate::storage::Mutation>> {
        let ownership = self.messages.ownership();
        let handed = |check: Handed| !matches!(check, Handed::Back);
        let mut all = Vec::new();
        for t in self.store.moved(moved::TENANT)? {
            let tenant = t.tenant;
            let conversations = self.messages.tenant_conversation_ids(tenant)?;
            let homes = self.store.homes_of_tenant(tenant)?;
            let users = self.tenant_user_ids(&conversations, &homes)?;
            let mut m = crate::storage::Mutation::new();
            for id in conversations {
                if handed(Handed::of(ownership.check(tenant, id, Epoch(0)))) {
                    m.mark_moved(moved::CONVERSATION, Moved { id: id.get(), ..t });
                }
            }
            for id in users {
                let user = UserKey::new(tenant, id);
                match Handed::of(self.homes.check_home(user, true)) {
                    // Home here again, and not by a move back: a new queue.
                    Handed::Back if self.store.home_is_stale(user)? => {
                        m.restart_queue(user, self.clock.now_ms())
                    }
                    Handed::Back => {}
                    _ => m.mark_moved(moved::USER, Moved { id: id.get(), ..t }),
                }
            }
            m.unmark_moved(moved::TENANT, tenant, 0);
            all.push(m);
        }
        Ok(all)
    }

    /// Waits (until `deadline`) for the processor to have applied every
    /// event it took so far.
    async fn barrier(&self, processor: &dyn ProcessorBarrier, deadline: Instant) -> Result<()> {
        tokio::time::timeout_at(deadline.into(), processor.barrier())
            .await
            .map_err(|_| CellError::RetryLater {
                reason: Reason::PipelineBusy,
                message: "the processor did not reach the seal in time".into(),
                retry_after: Duration::from_millis(200),
            })?
            .map_err(|e| CellError::RetryLater {
                reason: Reason::PipelineUnavailable,
                message: e.to_string(),
                retry_after: Duration::from_millis(200),
            })
    }

    /// Drops the sync state of users whose home has been elsewhere for
    /// `grace`; how many.
    pub async fn clean_moved_users(&self, grace: Duration) -> Result<u64> {
        let now = self.clock.now_ms();
        let handed = |m: &Moved| {
            Handed::of(
                self.homes
                    .check_home(UserKey::new(m.tenant, UserId(m.id)), true),
            )
        };
        let on = cleanup::Cleanup {
            // Back without a move (a move back imports the home and clears
            // the mark): the copy lacks what the home appended meanwhile.
            back: |m: &mut crate::storage::Mutation, moved: &Moved| {
                let user = UserKey::new(moved.tenant, UserId(moved.id));
                if self.store.home_is_stale(user)? {
                    m.restart_queue(user, now);
                }
                Ok(())
            },
            drop: |m: &mut crate::storage::Mutation, moved: &Moved| {
                m.unmark_moved(moved::CURRENT, moved.tenant, moved.id);
                Ok(self
                    .store
                    .clear_user(m, UserKey::new(moved.tenant, UserId(moved.id)))?)
            },
        };
        let dropped = cleanup::clean(&self.store, moved::USER, now, grace, handed, on)
            .await?
            .len();
        if dropped > 0 {
            tracing::info!(
                dropped,
                "dropped the sync state of users whose home moved away"
            );
        }
        Ok(dropped as u64)
    }
}
