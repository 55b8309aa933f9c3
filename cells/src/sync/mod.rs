//! The sync service: each user's ordered sync queue served to their devices
//! (subscribe from a cursor, then live; Rebase when too far behind; acks
//! that never move a cursor backwards), the conversation list with unread
//! counts, presence and typing notices. The queue itself is written by the
//! fan-out processor; this module only reads it and pushes.

mod hints;
mod hub;
mod inbox;
pub mod moving;
pub mod stream;

use cellmesh_proto::ids::{ConversationId, UserId};
use cellmesh_proto::reason::Reason;
use std::sync::Arc;

use cellmesh_proto::storage::v1::ConvListEntry;
use cellmesh_proto::v1::{
    AckResponse, ConversationSummary, GetPresenceResponse, ListConversationsResponse, Message,
    SyncPush, TypingNotice, UserPresence, sync_push,
};
use prost::Message as _;

pub use hints::HintPacer;
pub use hub::{Hub, HubEvent, LiveEvent, Subscription};
pub use inbox::{Inbox, Next};
pub use stream::event_message;

use crate::clock::Clock;
use crate::config::CellConfig;
use crate::convert::{conversation_to_proto, message_to_proto};
use crate::error::{CellError, Result};
use crate::homes::Homes;
use crate::message::{Caller, MessageService};
use crate::storage::{Mutation, ScanDirection, Store};

/// Conversations listed when the request names no limit.
const DEFAULT_LIST: usize = 100;
/// Most users one presence query may name.
const MAX_PRESENCE_QUERY: usize = 1_000;

pub use crate::user::Device;

pub struct SyncService {
    store: Arc<Store>,
    hub: Arc<Hub>,
    messages: Arc<MessageService>,
    config: Arc<CellConfig>,
    clock: Arc<dyn Clock>,
    homes: Arc<dyn Homes>,
    /// Acks and settings hold the read side from their home check to their
    /// commit; sealing a moving home takes the write side.
    user_writes: tokio::sync::RwLock<()>,
}

impl SyncService {
    pub fn new(
        store: Arc<Store>,
        hub: Arc<Hub>,
        messages: Arc<MessageService>,
        config: Arc<CellConfig>,
        clock: Arc<dyn Clock>,
        homes: Arc<dyn Homes>,
    ) -> Self {
        Self {
            store,
            hub,
            messages,
            config,
            clock,
            homes,
            user_writes: tokio::sync::RwLock::new(()),
        }
    }

    /// Checks that `caller`'s home is here (see [`Homes::check_home`]).
    pub fn check_home(&self, caller: &Caller, write: bool) -> Result<()> {
        self.homes.check_home(*caller, write)
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Raises the device's cursor to `pts` of queue `queue_id` (0: this
    /// one); a pts of another queue changes nothing.
    pub async fn ack(&self, device: Device, pts: u64, queue_id: u64) -> Result<AckResponse> {
        self.settle_home(device.caller).await?;
        let _writing = self.user_writes.read().await;
        self.check_home(&device.caller, true)?;
        let user = device.caller;
        let latest = self.store.user_pts(user)?;
        let current = self.store.queue_id(user)?;
        if queue_id != 0 && current != 0 && queue_id != current {
            return Ok(AckResponse {
                cursor: self.store.device_cursor(user, &device.device)?,
                latest_pts: latest,
                queue_id: current,
            });
        }
        if pts > latest {
            return Err(CellError::invalid(
                Reason::PtsAhead,
                format!("pts {pts} is beyond the latest {latest}"),
            ));
        }
        if pts > self.store.device_cursor(user, &device.device)? {
            let mut m = Mutation::new();
            m.raise_device_cursor(user, &device.device, pts);
            self.store.commit(m).await?;
        }
        Ok(AckResponse {
            cursor: self.store.device_cursor(user, &device.device)?,
            latest_pts: latest,
            queue_id: current,
        })
    }

    /// The ids of all the caller's conversations (those not left).
    pub fn conversation_ids(&self, caller: Caller) -> Result<Vec<ConversationId>> {
        self.check_home(&caller, false)?;
        Ok((self.store.conv_list(caller)?.into_iter())
            .filter(|(_, entry)| !entry.left)
            .map(|(id, _)| ConversationId(id))
            .collect())
    }

    /// The caller's conversations, most recently active first, with the
    /// last message and unread count computed now (so large groups, which
    /// keep nothing per member, are as current as small ones).
    pub fn list_conversations(
        &self,
        caller: Caller,
        limit: u32,
    ) -> Result<ListConversationsResponse> {
        self.check_home(&caller, false)?;
        let limit = match limit {
            0 => DEFAULT_LIST,
            n => (n as usize).min(self.config.limits.max_pull_limit as usize),
        };
        let mut out = Vec::new();
        for (id, entry) in self.store.conv_list(caller)? {
            if entry.left {
                continue;
            }
            let Some(record) = self.store.conversation(ConversationId(id))? else {
                continue;
            };
            if record.tenant_id != caller.tenant.get() {
                continue;
            }
            let seq = self.store.conv_seq(ConversationId(id))?;
            let last_message = self
                .store
                .scan_messages(
                    ConversationId(id),
                    caller.user,
                    seq.latest_seq.saturating_add(1),
                    0,
                    ScanDirection::Backward,
                    1,
                    usize::MAX,
                )?
                .messages
                .pop()
                .map(|(s, m)| message_to_proto(ConversationId(id), s, m));
            let last_message = match last_message {
                Some(m) if m.seq >= entry.last_seq => Some(m),
                local => self.remote_last_message(caller, &entry)?.or(local),
            };
            let read_seq = self.store.read_seq(ConversationId(id), caller.user)?;
            // A conversation owned by another cell (moved away, or remote)
            // is only as current here as the events that reached its members.
            let latest = seq.latest_seq.max(entry.last_seq);
            let updated_at_ms = last_message
                .as_ref()
                .map_or(record.created_at_ms, |m| m.server_ts_ms)
                .max(entry.updated_at_ms);
            out.push(ConversationSummary {
                conversation: Some(conversation_to_proto(ConversationId(id), &record, &seq)),
                last_message,
                read_seq,
                unread: latest.saturating_sub(read_seq),
                muted: self.store.muted(caller, ConversationId(id))?,
                updated_at_ms,
            });
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.updated_at_ms));
        let has_more = out.len() > limit;
        out.truncate(limit);
        Ok(ListConversationsResponse {
            conversations: out,
            has_more,
            conversation_ids: Vec::new(),
        })
    }

    /// The last message of a conversation whose history here lacks it, as
    /// the sync event about it carries it.
    fn remote_last_message(&self, user: Caller, entry: &ConvListEntry) -> Result<Option<Message>> {
        if entry.last_message_pts == 0 {
            return Ok(None);
        }
        let event = self.store.sync_event(user, entry.last_message_pts)?;
        Ok(event.and_then(|record| Message::decode(record.remote_message.as_slice()).ok()))
    }

    pub async fn set_muted(
        &self,
        caller: Caller,
        conversation: ConversationId,
        muted: bool,
    ) -> Result<()> {
        self.messages.check_call(&caller)?;
        let _writing = self.user_writes.read().await;
        self.check_home(&caller, true)?;
        self.messages.check_member(&caller, conversation)?;
        let mut m = Mutation::new();
        m.set_muted(caller, conversation, muted);
        self.store.commit(m).await?;
        Ok(())
    }

    /// Records a heartbeat; returns the interval to keep to stay online.
    pub fn heartbeat(&self, device: &Device) -> Result<u64> {
        self.messages.check_call(&device.caller)?;
        self.hub
            .heartbeat(device.caller, &device.device, self.clock.now_ms());
        Ok(self.config.sync.presence_window_secs * 1000 / 2)
    }

    /// Presence of `users` of the caller's tenant (never another tenant's).
    pub fn presence(&self, caller: Caller, users: &[UserId]) -> Result<GetPresenceResponse> {
        if users.len() > MAX_PRESENCE_QUERY {
            return Err(CellError::invalid(
                Reason::TooManyUsers,
                format!("at most {MAX_PRESENCE_QUERY} users per query"),
            ));
        }
        let now = self.clock.now_ms();
        Ok(GetPresenceResponse {
            users: users
                .iter()
                .map(|u| {
                    let (online, last_seen_ms) =
                        self.hub.presence(caller.peer(UserId((*u).get())), now);
                    UserPresence {
                        user_id: (*u).get(),
                        online,
                        last_seen_ms,
                    }
                })
                .collect(),
        })
    }

    /// Pushes a typing notice to the other members' streaming devices
    /// (the hub skips members with none); stores nothing.
    pub fn typing(&self, caller: Caller, conversation: ConversationId) -> Result<()> {
        self.messages.check_call(&caller)?;
        self.messages.check_member(&caller, conversation)?;
        let push = SyncPush {
            push: Some(sync_push::Push::Typing(TypingNotice {
                conversation_id: conversation.get(),
                user_id: caller.user.get(),
            })),
        };
        let (members, _) = self.store.members(conversation, 0, usize::MAX)?;
        let others: Vec<_> = members
            .into_iter()
            .map(|u| caller.peer(UserId(u)))
            .filter(|user| *user != caller)
            .collect();
        self.hub.push(&others, &push);
        Ok(())
    }
}
