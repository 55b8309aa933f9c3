//! A group's membership changes (AddMembers, RemoveMembers), merged. Calls
//! that arrive while another is being written queue on the conversation;
//! the next holder of its admin lock applies every queued call in one
//! commit with one `MembersChanged` event listing everyone the commit
//! changed, whoever asked. When a batch was written moments before
//! (`BURST_GAP`), the holder waits `BURST_LINGER` first, so a burst of
//! joins — each caller waiting for its answer before the next call — is a
//! few commits and events, not one per join, however fast the disk. Each
//! call keeps its own answer and its own refusal: one refused call does
//! not refuse the others, and later calls see the earlier ones' effect.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{ConversationRecord, MemberRecord, OutboxEvent, OutboxKind};
use cellmesh_proto::v1::ChangeMembersResponse;
use tokio::sync::oneshot;

use super::conversation::{ChangeMembersCommand, is_admin, not_admin};
use super::{Caller, MessageService, not_a_member};
use crate::convert::conversation_to_proto;
use crate::error::{CellError, Result};
use crate::metrics::metrics;
use crate::storage::{Mutation, StorageError};

/// A batch written less than this long ago marks a burst.
const BURST_GAP: Duration = Duration::from_millis(50);

/// How long the admin lock's holder gathers calls during a burst before
/// writing them: a join's added latency, against commits and events saved.
const BURST_LINGER: Duration = Duration::from_millis(2);

/// The calls waiting for a conversation's admin lock, and when its last
/// batch was written.
#[derive(Default)]
pub(crate) struct MemberQueue {
    calls: Vec<PendingChange>,
    last_written: Option<Instant>,
}

impl MemberQueue {
    /// Whether the holder should wait for more calls: some wait, and a
    /// batch was written moments ago.
    fn in_burst(&self) -> bool {
        !self.calls.is_empty() && self.last_written.is_some_and(|t| t.elapsed() < BURST_GAP)
    }
}

/// A call waiting for the conversation's admin lock.
pub(crate) struct PendingChange {
    cmd: ChangeMembersCommand,
    add: bool,
    reply: oneshot::Sender<Result<ChangeMembersResponse>>,
}

/// One batch's view of membership: what its earlier calls decided, over
/// what is stored.
struct Batch<'a> {
    service: &'a MessageService,
    tenant: TenantId,
    conversation: ConversationId,
    record: ConversationRecord,
    decided: HashMap<UserId, bool>,
    latest_seq: u64,
    now: u64,
    mutation: Mutation,
    /// Who asked for the changes applied, in the order first seen.
    callers: Vec<u64>,
}

impl MessageService {
    /// Adds (`add = true`) or removes members of a group. Any member adds
    /// and leaves; the creator and admins remove others (the creator
    /// only leaves).
    #[tracing::instrument(skip_all, fields(tenant = cmd.caller.tenant.get(), conversation = cmd.conversation.get(), user = cmd.caller.user.get(), add))]
    pub async fn change_members(
        &self,
        cmd: ChangeMembersCommand,
        add: bool,
    ) -> Result<ChangeMembersResponse> {
        self.validate_member_list(&cmd.users)?;
        if cmd.users.is_empty() {
            return Err(CellError::invalid(Reason::NoUsers, "user_ids is empty"));
        }
        let conv = self.group_entry(&cmd.caller, cmd.conversation)?;
        let (reply, mut answer) = oneshot::channel();
        let queued = PendingChange { cmd, add, reply };
        let queue = || conv.member_changes.lock().expect("member changes");
        queue().calls.push(queued);
        let _admin = conv.admin.lock().await;
        // An earlier holder of the lock may have applied this call.
        if let Ok(done) = answer.try_recv() {
            return done;
        }
        if queue().in_burst() {
            tokio::time::sleep(BURST_LINGER).await;
        }
        let batch = std::mem::take(&mut queue().calls);
        if !batch.is_empty() {
            self.apply_member_changes(batch).await;
            queue().last_written = Some(Instant::now());
        }
        answer.await.unwrap_or_else(|_| {
            Err(StorageError::Failed("a membership change ended without an answer".into()).into())
        })
    }

    pub(super) fn validate_member_list(&self, users: &[u64]) -> Result<()> {
        let max = self.config.limits.max_members_per_request;
        if users.len() > max {
            return Err(CellError::invalid(
                Reason::TooManyMembersInRequest,
                format!("at most {max} member ids per request"),
            ));
        }
        if users.contains(&0) {
            return Err(CellError::invalid(
                Reason::InvalidUserId,
                "user id 0 is not valid",
            ));
        }
        Ok(())
    }

    /// Applies `calls` (all on one conversation, under its admin lock) in
    /// one commit and answers each.
    async fn apply_member_changes(&self, calls: Vec<PendingChange>) {
        let _writing = self.writing.read().await;
        let (tenant, conversation) = (calls[0].cmd.caller.tenant, calls[0].cmd.conversation);
        let mut batch = match Batch::start(self, tenant, conversation) {
            Ok(batch) => batch,
            Err(e) => return answer_all(calls.into_iter().map(|c| c.reply), &e),
        };
        let mut applied = Vec::with_capacity(calls.len());
        for call in calls {
            match batch.apply(&call.cmd, call.add) {
                Ok(changed) => applied.push((call.reply, changed)),
                Err(e) => {
                    let _ = call.reply.send(Err(e));
                }
            }
        }
        let record = match batch.commit().await {
            Ok(record) => record,
            Err(e) => return answer_all(applied.into_iter().map(|(r, _)| r), &e),
        };
        metrics().member_change_calls.inc_by(applied.len() as u64);
        let seq = match self.store.conv_seq(conversation) {
            Ok(seq) => seq,
            Err(e) => return answer_all(applied.into_iter().map(|(r, _)| r), &e.into()),
        };
        for (reply, changed) in applied {
            let _ = reply.send(Ok(ChangeMembersResponse {
                conversation: Some(conversation_to_proto(conversation, &record, &seq)),
                changed,
            }));
        }
    }
}

fn answer_all(
    replies: impl Iterator<Item = oneshot::Sender<Result<ChangeMembersResponse>>>,
    error: &CellError,
) {
    for reply in replies {
        let _ = reply.send(Err(error.clone()));
    }
}

impl<'a> Batch<'a> {
    fn start(
        service: &'a MessageService,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<Self> {
        Ok(Self {
            service,
            tenant,
            conversation,
            record: service.stored_conversation(conversation.get())?,
            decided: HashMap::new(),
            latest_seq: service.store.conv_seq(conversation)?.latest_seq,
            now: service.now_ms(),
            mutation: Mutation::new(),
            callers: Vec::new(),
        })
    }

    fn is_member(&self, user: UserId) -> Result<bool> {
        match self.decided.get(&user) {
            Some(member) => Ok(*member),
            None => Ok(self.service.store.is_member(self.conversation, user)?),
        }
    }

    /// Checks and applies one call: whom it changed. A refused call
    /// changes nothing.
    fn apply(&mut self, cmd: &ChangeMembersCommand, add: bool) -> Result<Vec<u64>> {
        let caller = cmd.caller;
        self.service
            .ownership
            .check(caller.tenant, self.conversation, Epoch(0))?;
        if !self.is_member(caller.user)? {
            return Err(not_a_member(caller.user, self.conversation));
        }
        let mut unique = cmd.users.clone();
        unique.sort_unstable();
        unique.dedup();
        if !add {
            self.check_removal(&caller, &unique)?;
        }
        let mut changed = Vec::new();
        for user in unique {
            if self.is_member(UserId(user))? != add {
                changed.push(user);
            }
        }
        let count = if add {
            self.record.member_count as usize + changed.len()
        } else {
            (self.record.member_count as usize).saturating_sub(changed.len())
        };
        let max = self.service.config.limits.max_group_members;
        if count > max as usize {
            return Err(CellError::invalid(
                Reason::TooManyMembers,
                format!("a group has at most {max} members"),
            ));
        }
        if changed.is_empty() {
            return Ok(changed);
        }
        self.record.member_count = count as u32;
        // A member who leaves is no longer an admin.
        self.record.admins.retain(|a| add || !changed.contains(a));
        for user in &changed {
            self.decided.insert(UserId(*user), add);
            if add {
                // A member who joins has read what came before: unread
                // counts from the join on.
                let joined = MemberRecord {
                    joined_at_ms: self.now,
                };
                self.mutation
                    .put_member(self.conversation, UserId(*user), &joined);
                self.mutation
                    .raise_read_seq(self.conversation, UserId(*user), self.latest_seq);
            } else {
                self.mutation
                    .delete_member(self.conversation, UserId(*user));
            }
        }
        if !self.callers.contains(&caller.user.get()) {
            self.callers.push(caller.user.get());
        }
        Ok(changed)
    }

    /// Only the creator and admins remove others; the creator is never
    /// removed (it leaves).
    fn check_removal(&self, caller: &Caller, users: &[u64]) -> Result<()> {
        let Some(other) = users.iter().find(|u| **u != caller.user.get()) else {
            return Ok(());
        };
        if !is_admin(&self.record, caller.user) {
            return Err(not_admin(&self.record, caller.user, "removes others"));
        }
        if users.contains(&self.record.created_by) {
            return Err(CellError::PermissionDenied {
                reason: Reason::NotConversationAdmin,
                message: format!(
                    "the group's creator (user {}) leaves but is not removed (by user {}, removing {other})",
                    self.record.created_by, caller.user
                ),
            });
        }
        Ok(())
    }

    /// Writes what the batch changed, if anything: the record and one
    /// event listing every user changed (each once; the processor reads
    /// whether each joined or left from the members it finds), its
    /// `user_id` the caller when there was one, else 0. Returns the record.
    async fn commit(self) -> Result<ConversationRecord> {
        if self.decided.is_empty() {
            return Ok(self.record);
        }
        let mut changed: Vec<u64> = self.decided.keys().map(|u| u.get()).collect();
        changed.sort_unstable();
        let mut m = self.mutation;
        m.put_conversation(self.conversation, &self.record);
        m.emit(&OutboxEvent {
            kind: OutboxKind::MembersChanged as i32,
            tenant_id: self.tenant.get(),
            conversation_id: self.conversation.get(),
            user_id: match self.callers[..] {
                [caller] => caller,
                _ => 0,
            },
            server_ts_ms: self.now,
            items: changed,
            ..Default::default()
        });
        self.service.store.commit(m).await?;
        metrics().member_change_events.inc();
        Ok(self.record)
    }
}
