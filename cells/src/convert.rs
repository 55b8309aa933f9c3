//! Wire ↔ domain conversions. Wire input is validated here, once: a request
//! that converts into a command has a caller, a conversation id and known
//! enum values; records convert into the wire view of a message or
//! conversation.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{ConversationRecord, ConversationSeq, MessageRecord, SeqJump};
use cellmesh_proto::v1 as pb;

use crate::error::CellError;
use crate::message::{
    Caller, ChangeMembersCommand, CreateCommand, DeleteForMeCommand, EditCommand,
    GetConversationCommand, MarkReadCommand, PullCommand, ReadCountCommand, RecallCommand,
    SendCommand, SetMemberRoleCommand,
};
use crate::storage::ScanDirection;

/// The caller of a request: tenant and user are required.
pub fn caller(caller: Option<pb::Caller>) -> Result<Caller, CellError> {
    match caller {
        Some(c) if c.tenant_id != 0 && c.user_id != 0 => {
            Ok(Caller::new(TenantId(c.tenant_id), UserId(c.user_id)))
        }
        _ => Err(CellError::Unauthenticated {
            message: "request carries no caller (tenant_id and user_id are required)".into(),
        }),
    }
}

/// The conversation id of a request (required).
pub fn conversation_id(id: u64) -> Result<ConversationId, CellError> {
    if id == 0 {
        return Err(CellError::invalid(
            Reason::MissingConversationId,
            "conversation_id is required",
        ));
    }
    Ok(ConversationId(id))
}

impl TryFrom<pb::SendRequest> for SendCommand {
    type Error = CellError;

    fn try_from(r: pb::SendRequest) -> Result<Self, CellError> {
        let kind = match pb::MessageType::try_from(r.r#type) {
            Ok(pb::MessageType::Unspecified) | Err(_) => {
                return Err(CellError::invalid(
                    Reason::UnknownMessageType,
                    format!("message type {} is not known", r.r#type),
                ));
            }
            Ok(kind) => kind,
        };
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            client_req_id: r.client_req_id,
            kind,
            body: r.body,
            route_epoch: r.route_epoch,
            visible_to: r.visible_to,
            attachments: r.attachment_ids,
        })
    }
}

impl TryFrom<pb::PullRequest> for PullCommand {
    type Error = CellError;

    fn try_from(r: pb::PullRequest) -> Result<Self, CellError> {
        let direction = match pb::Direction::try_from(r.direction) {
            Ok(pb::Direction::Forward) => ScanDirection::Forward,
            Ok(pb::Direction::Backward) => ScanDirection::Backward,
            Err(_) => {
                return Err(CellError::invalid(
                    Reason::UnknownDirection,
                    format!("direction {} is not known", r.direction),
                ));
            }
        };
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            since_seq: r.since_seq,
            direction,
            limit: r.limit,
        })
    }
}

impl TryFrom<pb::SearchRequest> for crate::message::SearchCommand {
    type Error = CellError;

    fn try_from(r: pb::SearchRequest) -> Result<Self, CellError> {
        let caller = caller(r.caller)?;
        if caller.user.get() == crate::storage::EVERY_MESSAGE {
            return Err(CellError::Unauthenticated {
                message: "the caller's user id is reserved".into(),
            });
        }
        let some = |v: u64| (v != 0).then_some(v);
        Ok(Self {
            caller,
            query: r.query,
            conversation: some(r.conversation_id).map(ConversationId),
            conversations: ConversationId::many(&r.conversation_ids),
            sender: some(r.sender_id).map(UserId),
            from_ms: some(r.from_ms),
            to_ms: some(r.to_ms),
            page_size: r.page_size,
            before_msg_id: some(r.before_msg_id),
            context: r.context,
        })
    }
}

impl TryFrom<pb::CreateConversationRequest> for CreateCommand {
    type Error = CellError;

    fn try_from(r: pb::CreateConversationRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            kind: pb::ConversationKind::try_from(r.kind)
                .unwrap_or(pb::ConversationKind::Unspecified),
            title: r.title,
            members: r.member_ids,
            client_req_id: r.client_req_id,
        })
    }
}

impl TryFrom<pb::ChangeMembersRequest> for ChangeMembersCommand {
    type Error = CellError;

    fn try_from(r: pb::ChangeMembersRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            users: r.user_ids,
        })
    }
}

impl TryFrom<pb::SetMemberRoleRequest> for SetMemberRoleCommand {
    type Error = CellError;

    fn try_from(r: pb::SetMemberRoleRequest) -> Result<Self, CellError> {
        if r.user_id == 0 {
            return Err(CellError::invalid(
                Reason::InvalidUserId,
                "user id 0 is not valid",
            ));
        }
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            user: UserId(r.user_id),
            admin: r.admin,
        })
    }
}

impl TryFrom<pb::GetConversationRequest> for GetConversationCommand {
    type Error = CellError;

    fn try_from(r: pb::GetConversationRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            members_after: r.members_after,
            member_limit: r.member_limit,
        })
    }
}

impl TryFrom<pb::MarkReadRequest> for MarkReadCommand {
    type Error = CellError;

    fn try_from(r: pb::MarkReadRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            read_seq: r.read_seq,
        })
    }
}

fn message_seq(seq: u64) -> Result<u64, CellError> {
    if seq == 0 {
        return Err(CellError::invalid(Reason::MissingSeq, "seq is required"));
    }
    Ok(seq)
}

impl TryFrom<pb::RecallRequest> for RecallCommand {
    type Error = CellError;

    fn try_from(r: pb::RecallRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            seq: message_seq(r.seq)?,
        })
    }
}

impl TryFrom<pb::EditRequest> for EditCommand {
    type Error = CellError;

    fn try_from(r: pb::EditRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            seq: message_seq(r.seq)?,
            body: r.body,
        })
    }
}

impl TryFrom<pb::ReadCountRequest> for ReadCountCommand {
    type Error = CellError;

    fn try_from(r: pb::ReadCountRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            seqs: r.seqs,
        })
    }
}

impl TryFrom<pb::DeleteForMeRequest> for DeleteForMeCommand {
    type Error = CellError;

    fn try_from(r: pb::DeleteForMeRequest) -> Result<Self, CellError> {
        Ok(Self {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            seqs: r.seqs,
        })
    }
}

/// The wire view of a stored message.
pub fn message_to_proto(conversation: ConversationId, seq: u64, r: MessageRecord) -> pb::Message {
    pb::Message {
        conversation_id: conversation.get(),
        seq,
        msg_id: r.msg_id,
        sender_id: r.sender_id,
        r#type: r.r#type,
        body: r.body,
        server_ts_ms: r.server_ts_ms,
        state: r.state,
        edited_at_ms: r.edited_at_ms,
        edit_version: r.edit_version,
        visible_to: r.visible_to,
        attachments: r.attachments,
    }
}

/// The wire view of a stored conversation.
pub fn conversation_to_proto(
    id: ConversationId,
    r: &ConversationRecord,
    seq: &ConversationSeq,
) -> pb::Conversation {
    pb::Conversation {
        conversation_id: id.get(),
        tenant_id: r.tenant_id,
        kind: r.kind,
        title: r.title.clone(),
        created_by: r.created_by,
        created_at_ms: r.created_at_ms,
        member_count: r.member_count,
        latest_seq: seq.latest_seq,
        seq_floor: seq.seq_floor,
        admin_ids: r.admins.clone(),
        skipped: seq.jumps.iter().map(skipped_to_proto).collect(),
    }
}

/// A floor jump as clients see it.
pub fn skipped_to_proto(j: &SeqJump) -> pb::SkippedSeqs {
    pb::SkippedSeqs {
        first: j.first,
        last: j.last,
        epoch: j.epoch,
        reason: j.reason,
    }
}

/// `into` and the jumps of `from` it lacks, oldest first.
pub fn merge_jumps(into: &mut Vec<SeqJump>, from: &[SeqJump]) -> bool {
    let mut changed = false;
    for j in from {
        if !into.iter().any(|k| (k.first, k.last) == (j.first, j.last)) {
            into.push(*j);
            changed = true;
        }
    }
    into.sort_by_key(|j| (j.last, j.first));
    changed
}

/// The calling device of a sync request: a caller with a device id.
pub fn device(c: Option<pb::Caller>) -> Result<crate::user::Device, CellError> {
    let device = c.as_ref().map(|c| c.device_id.clone()).unwrap_or_default();
    let caller = caller(c)?;
    if device.is_empty() || device.len() > 128 {
        return Err(CellError::invalid(
            Reason::BadDeviceId,
            "caller.device_id is required (1..=128 bytes)",
        ));
    }
    Ok(crate::user::Device { caller, device })
}
