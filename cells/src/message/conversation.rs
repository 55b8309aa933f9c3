//! Conversations: creation (idempotent when the client names a request id),
//! roles (membership changes are in `members`) and the conversation view
//! with the caller's unread count.

use cellmesh_proto::ids::{ConversationId, Epoch, UserId};
use cellmesh_proto::reason::Reason;
use std::collections::BTreeSet;
use std::sync::Arc;

use cellmesh_proto::storage::v1::{
    ConversationRecord, ConversationSeq, IdempotencyRecord, MemberRecord, OutboxEvent, OutboxKind,
};
use cellmesh_proto::v1::{
    ChangeMembersResponse, Conversation, ConversationKind, GetConversationResponse,
};

use super::cache::ConvEntry;
use super::inflight::Begin;
use super::send::concurrent_attempt_failed;
use super::{Caller, MessageService};
use crate::convert::conversation_to_proto;
use crate::error::{CellError, Result};
use crate::ownership::Creation;
use crate::storage::{IdemKey, IdemKind, Mutation};

/// Members listed when the request names no page size.
const DEFAULT_MEMBER_PAGE: usize = 100;

#[derive(Debug, Clone)]
pub struct CreateCommand {
    pub caller: Caller,
    pub kind: ConversationKind,
    pub title: String,
    pub members: Vec<u64>,
    pub client_req_id: String,
}

#[derive(Debug, Clone)]
pub struct ChangeMembersCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub users: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct SetMemberRoleCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub user: UserId,
    pub admin: bool,
}

/// Admins of a group besides its creator, at most.
pub const MAX_ADMINS: usize = 32;

#[derive(Debug, Clone)]
pub struct GetConversationCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub members_after: u64,
    pub member_limit: u32,
}

impl MessageService {
    #[tracing::instrument(skip_all, fields(tenant = cmd.caller.tenant.get(), user = cmd.caller.user.get(), req_id = %cmd.client_req_id))]
    pub async fn create_conversation(&self, cmd: CreateCommand) -> Result<Conversation> {
        let members = self.validate_create(&cmd)?;
        // New conversations belong to their tenant's cell (or the target of
        // its migration).
        let _creating = self.creating.read().await;
        let creation = self.ownership.check_create(cmd.caller.tenant)?;
        let key = (!cmd.client_req_id.is_empty()).then(|| IdemKey {
            kind: IdemKind::CreateConversation,
            tenant: cmd.caller.tenant,
            user: cmd.caller.user,
            client_req_id: cmd.client_req_id.clone(),
        });
        let leader = match key.as_ref().map(|k| self.inflight.begin(k.clone())) {
            Some(Begin::Follower(f)) => {
                let record = f.wait().await.ok_or_else(concurrent_attempt_failed)?;
                return self.conversation_view(&cmd.caller, record.conversation_id);
            }
            Some(Begin::Leader(leader)) => Some(leader),
            None => None,
        };
        if let Some(key) = &key
            && let Some(record) = self.store.idempotency(key)?
            && record.expires_at_ms > self.now_ms()
        {
            let view = self.conversation_view(&cmd.caller, record.conversation_id);
            if let Some(leader) = leader {
                leader.complete(record);
            }
            return view;
        }
        // A new conversation (a retry of a created one is answered above).
        self.check_call(&cmd.caller)?;

        let now = self.now_ms();
        let id = self.next_id(now)?;
        if creation == Creation::Place {
            self.ownership
                .place(cmd.caller.tenant, ConversationId(id))
                .await?;
        }
        let record = ConversationRecord {
            tenant_id: cmd.caller.tenant.get(),
            kind: cmd.kind as i32,
            title: cmd.title,
            created_by: cmd.caller.user.get(),
            created_at_ms: now,
            member_count: members.len() as u32,
            admins: Vec::new(),
        };
        let mut m = Mutation::new();
        m.put_conversation(ConversationId(id), &record);
        m.put_conv_seq(ConversationId(id), &ConversationSeq::default());
        // Created under a route with a failover floor: its history begins
        // here, so nothing below the floor is missing anywhere.
        let floor = self.ownership.floor(cmd.caller.tenant, ConversationId(id));
        if floor > 0 {
            super::migrate::put_backfilled(&mut m, ConversationId(id), floor, floor);
        }
        for user in &members {
            m.put_member(
                ConversationId(id),
                UserId(*user),
                &MemberRecord { joined_at_ms: now },
            );
        }
        let idem = IdempotencyRecord {
            conversation_id: id,
            server_ts_ms: now,
            expires_at_ms: self.idempotency_expiry(now),
            ..Default::default()
        };
        if let Some(key) = &key {
            m.put_idempotency(key, &idem);
        }
        m.emit(&OutboxEvent {
            kind: OutboxKind::ConversationCreated as i32,
            tenant_id: cmd.caller.tenant.get(),
            conversation_id: id,
            user_id: cmd.caller.user.get(),
            server_ts_ms: now,
            items: members.iter().copied().collect(),
            ..Default::default()
        });
        self.store.commit(m).await?;
        if let Some(leader) = leader {
            leader.complete(idem);
        }
        tracing::info!(
            conversation = id,
            members = members.len(),
            "conversation created"
        );
        Ok(conversation_to_proto(
            ConversationId(id),
            &record,
            &ConversationSeq::default(),
        ))
    }

    fn validate_create(&self, cmd: &CreateCommand) -> Result<BTreeSet<u64>> {
        let limits = &self.config.limits;
        if cmd.title.len() > limits.max_title_bytes {
            return Err(CellError::invalid(
                Reason::TitleTooLong,
                format!("title is longer than {} bytes", limits.max_title_bytes),
            ));
        }
        if cmd.client_req_id.len() > limits.max_client_req_id_bytes {
            return Err(CellError::invalid(
                Reason::ClientReqIdTooLong,
                "client_req_id is too long",
            ));
        }
        self.validate_member_list(&cmd.members)?;
        let mut members: BTreeSet<u64> = cmd.members.iter().copied().collect();
        members.insert(cmd.caller.user.get());
        match cmd.kind {
            ConversationKind::Direct if members.len() != 2 => Err(CellError::invalid(
                Reason::DirectNeedsTwoMembers,
                "a direct conversation has exactly two distinct members",
            )),
            ConversationKind::Group if members.len() > limits.max_group_members as usize => {
                Err(CellError::invalid(
                    Reason::TooManyMembers,
                    format!("a group has at most {} members", limits.max_group_members),
                ))
            }
            ConversationKind::Direct | ConversationKind::Group => Ok(members),
            ConversationKind::Unspecified => Err(CellError::invalid(
                Reason::UnknownConversationKind,
                "conversation kind must be DIRECT or GROUP",
            )),
        }
    }

    /// Makes a member of a group an admin, or no longer one: the creator
    /// and admins may. The creator stays an admin.
    #[tracing::instrument(skip_all, fields(tenant = cmd.caller.tenant.get(), conversation = cmd.conversation.get(), user = cmd.caller.user.get(), admin = cmd.admin))]
    pub async fn set_member_role(
        &self,
        cmd: SetMemberRoleCommand,
    ) -> Result<ChangeMembersResponse> {
        let caller = cmd.caller;
        self.change_group(&cmd.caller, cmd.conversation, |record, _| {
            if !is_admin(record, caller.user) {
                return Err(not_admin(record, caller.user, "changes roles"));
            }
            if cmd.user == UserId(record.created_by) {
                return Err(CellError::invalid(
                    Reason::IllegalTransition,
                    "the group's creator is always an admin",
                ));
            }
            if !self.store.is_member(cmd.conversation, cmd.user)? {
                return Err(CellError::invalid(
                    Reason::RecipientNotAMember,
                    format!("user {} is not a member", cmd.user),
                ));
            }
            if record.admins.contains(&cmd.user.get()) == cmd.admin {
                return Ok((Vec::new(), None));
            }
            if cmd.admin {
                if record.admins.len() >= MAX_ADMINS {
                    return Err(CellError::invalid(
                        Reason::TooManyMembers,
                        format!("a group has at most {MAX_ADMINS} admins besides its creator"),
                    ));
                }
                record.admins.push(cmd.user.get());
                record.admins.sort_unstable();
            } else {
                record.admins.retain(|a| *a != cmd.user.get());
            }
            // Standbys receive the record with the role.
            let event = OutboxEvent {
                kind: OutboxKind::MetaSync as i32,
                ..Default::default()
            };
            Ok((vec![cmd.user.get()], Some((Mutation::new(), event))))
        })
        .await
    }

    /// A group of the caller's tenant owned here, for a change of its
    /// membership or roles.
    pub(super) fn group_entry(
        &self,
        caller: &Caller,
        conversation: ConversationId,
    ) -> Result<Arc<ConvEntry>> {
        self.check_call(caller)?;
        let conv = self.conversation(caller, conversation.get())?;
        self.ownership
            .check(caller.tenant, conversation, Epoch(0))?;
        if conv.kind != ConversationKind::Group {
            return Err(CellError::invalid(
                Reason::NotAGroup,
                "members of a direct conversation cannot change",
            ));
        }
        Ok(conv)
    }

    /// The common path of a group's membership and roles: owned here, a
    /// group, the caller a member, one change at a time; `change` edits the
    /// record and says who changed and what to write (with the record and
    /// an event filled in here).
    async fn change_group(
        &self,
        caller: &Caller,
        conversation: ConversationId,
        change: impl FnOnce(
            &mut ConversationRecord,
            u64,
        ) -> Result<(Vec<u64>, Option<(Mutation, OutboxEvent)>)>,
    ) -> Result<ChangeMembersResponse> {
        let conv = self.group_entry(caller, conversation)?;
        let _admin = conv.admin.lock().await;
        // Checked again where a tenant seal waits for it.
        let _writing = self.writing.read().await;
        self.ownership
            .check(caller.tenant, conversation, Epoch(0))?;
        self.require_member(caller, conversation)?;
        let mut record = self.stored_conversation(conversation.get())?;
        let now = self.now_ms();
        let (changed, write) = change(&mut record, now)?;
        if let Some((mut m, mut event)) = write {
            m.put_conversation(conversation, &record);
            event.tenant_id = caller.tenant.get();
            event.conversation_id = conversation.get();
            event.user_id = caller.user.get();
            event.server_ts_ms = now;
            m.emit(&event);
            self.store.commit(m).await?;
        }
        let seq = self.store.conv_seq(conversation)?;
        Ok(ChangeMembersResponse {
            conversation: Some(conversation_to_proto(conversation, &record, &seq)),
            changed,
        })
    }

    pub fn get_conversation(&self, cmd: GetConversationCommand) -> Result<GetConversationResponse> {
        self.ownership
            .check_read(cmd.caller.tenant, cmd.conversation)?;
        self.conversation(&cmd.caller, cmd.conversation.get())?;
        self.require_member(&cmd.caller, cmd.conversation)?;
        let record = self.stored_conversation(cmd.conversation.get())?;
        let seq = self.store.conv_seq(cmd.conversation)?;
        let limit = match cmd.member_limit {
            0 => DEFAULT_MEMBER_PAGE,
            n => (n as usize).min(self.config.limits.max_members_per_request),
        };
        let (member_ids, members_truncated) =
            self.store
                .members(cmd.conversation, cmd.members_after, limit)?;
        let read_seq = self.store.read_seq(cmd.conversation, cmd.caller.user)?;
        Ok(GetConversationResponse {
            conversation: Some(conversation_to_proto(cmd.conversation, &record, &seq)),
            member_ids,
            members_truncated,
            read_seq,
            unread: seq.latest_seq.saturating_sub(read_seq),
        })
    }

    fn conversation_view(&self, caller: &Caller, id: u64) -> Result<Conversation> {
        self.conversation(caller, id)?;
        let record = self.stored_conversation(id)?;
        Ok(conversation_to_proto(
            ConversationId(id),
            &record,
            &self.store.conv_seq(ConversationId(id))?,
        ))
    }

    pub(super) fn stored_conversation(&self, id: u64) -> Result<ConversationRecord> {
        self.store
            .conversation(ConversationId(id))?
            .ok_or(CellError::NotFound {
                what: "conversation",
                id,
            })
    }
}

/// Whether `user` is the group's creator or one of its admins.
pub(super) fn is_admin(record: &ConversationRecord, user: UserId) -> bool {
    record.created_by == user.get() || record.admins.contains(&user.get())
}

pub(super) fn not_admin(record: &ConversationRecord, user: UserId, what: &str) -> CellError {
    CellError::PermissionDenied {
        reason: Reason::NotConversationAdmin,
        message: format!(
            "only the group's creator (user {}) and its admins {what}, not user {user}",
            record.created_by
        ),
    }
}
