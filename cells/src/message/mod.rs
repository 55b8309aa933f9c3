//! The message service: the domain logic behind the messaging API. It owns
//! the rules of DESIGN.md §4 — validation, ownership, membership, rate
//! limits, idempotency, seq assignment — and turns each request into one
//! atomic storage [`Mutation`](crate::storage::Mutation). Operations live in
//! their own files: `send`, `pull`, `conversation` (create, members, get) and
//! `update` (recall, edit, delete-for-me, read state).

mod attach;
mod attach_copy;
mod cache;
pub(crate) mod cleanup;
mod cold_read;
mod conversation;
mod export;
mod incomplete;
mod inflight;
mod members;
mod migrate;
mod pull;
mod receipts;
mod replica;
mod restore;
mod search;
mod send;
mod tenant;
mod tier;
mod update;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::sync::Arc;

use cellmesh_proto::v1::ConversationKind;

pub use attach::CreateUploadCommand;
pub use conversation::{
    ChangeMembersCommand, CreateCommand, GetConversationCommand, SetMemberRoleCommand,
};
pub use pull::PullCommand;
pub use receipts::ReadCountCommand;
pub use restore::RestoredCopy;
pub use search::SearchCommand;
pub use send::SendCommand;
pub use tier::{TierReport, run as run_tierer};
pub use update::{DeleteForMeCommand, EditCommand, MarkReadCommand, RecallCommand};

use crate::clock::Clock;
use crate::config::CellConfig;
use crate::error::{CellError, Result};
use crate::hwm::HighWaterMarks;
use crate::ids::{IdGenerator, Next};
use crate::ownership::Ownership;
use crate::ratelimit::SendLimits;
use crate::replication::Replicator;
use crate::storage::{Store, keys};
use cache::{ConvCache, ConvEntry, SeqState};
use inflight::Inflight;

/// The authenticated identity a request acts as: a user of one tenant.
pub type Caller = crate::user::UserKey;

/// How far ahead of the clock message ids are reserved (one synced write
/// per this interval).
const ID_RESERVATION_MS: u64 = 10_000;

/// Conversations whose sequencer state is kept in memory.
const CONVERSATION_CACHE: usize = 1 << 20;

pub struct MessageService {
    store: Arc<Store>,
    config: Arc<CellConfig>,
    ids: IdGenerator,
    limits: SendLimits,
    conversations: ConvCache,
    /// Where the seq of written conversations is noted for the standbys.
    marks: Arc<HighWaterMarks>,
    /// Sends acknowledged since start.
    pub(crate) sends: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    inflight: Inflight,
    /// Held (shared) by every conversation creation from its ownership
    /// check to its commit; a tenant listing for a migration takes it
    /// exclusively, so no creation it cannot see is still in flight.
    creating: tokio::sync::RwLock<()>,
    /// Held (shared) by every send, rewrite and membership change from its
    /// decisive ownership check until its write is durable; a tenant seal
    /// takes it exclusively once, so no write checked before the freeze is
    /// still in flight (or not yet durable) after it.
    writing: tokio::sync::RwLock<()>,
    ownership: Arc<dyn Ownership>,
    clock: Arc<dyn Clock>,
    /// Ships the writes of `sync` tenants to the standbys before the ack.
    replicator: Arc<Replicator>,
    /// Where history older than the hot tier lives (`[tiering]` off: none).
    cold: Option<Arc<crate::cold::ColdTier>>,
    /// Conversations taken over without their record (see `incomplete`).
    repairs: Arc<incomplete::Repairs>,
    /// The file store (`[attachments]` off: none).
    attachments: Option<Arc<crate::attachments::Attachments>>,
    /// The tenants' search indexes (`[search]` off: none).
    search: Option<Arc<crate::search::Search>>,
}

impl MessageService {
    pub fn new(
        store: Arc<Store>,
        config: Arc<CellConfig>,
        ownership: Arc<dyn Ownership>,
        clock: Arc<dyn Clock>,
        replicator: Arc<Replicator>,
        marks: Arc<HighWaterMarks>,
    ) -> Result<Self> {
        let reserved = store
            .meta_u64(keys::meta::MSG_ID_RESERVED_UNTIL)?
            .unwrap_or(0);
        Ok(Self {
            ids: IdGenerator::new(config.instance_id, reserved),
            limits: SendLimits::new(&config.rate_limit),
            conversations: ConvCache::new(CONVERSATION_CACHE),
            marks,
            sends: Default::default(),
            started: std::time::Instant::now(),
            inflight: Inflight::new(),
            creating: Default::default(),
            writing: Default::default(),
            store,
            config,
            ownership,
            clock,
            replicator,
            cold: None,
            repairs: incomplete::Repairs::new(),
            attachments: None,
            search: None,
        })
    }

    /// Reads and writes cold history through `cold`.
    pub fn with_cold(mut self, cold: Option<Arc<crate::cold::ColdTier>>) -> Self {
        self.cold = cold;
        self
    }

    /// Stores and serves files through `attachments`.
    pub fn with_attachments(
        mut self,
        attachments: Option<Arc<crate::attachments::Attachments>>,
    ) -> Self {
        self.attachments = attachments;
        self
    }

    /// The tenants' search indexes, when search is on.
    pub fn search_indexes(&self) -> Option<&Arc<crate::search::Search>> {
        self.search.as_ref()
    }

    /// Answers `Search` from `search`.
    pub fn with_search(mut self, search: Option<Arc<crate::search::Search>>) -> Self {
        self.search = search;
        self
    }

    /// Whether a cell registered in the route table is reached at
    /// `address` (see [`Ownership::confirm_cell_address`]).
    pub async fn confirm_cell_address(&self, address: &str) -> Result<bool> {
        self.ownership.confirm_cell_address(address).await
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Takes one call that changes something (other than a send) from the
    /// caller's budget: `RATE_LIMITED` / `USER_RATE_LIMITED` over it.
    pub fn check_call(&self, caller: &Caller) -> Result<()> {
        self.limits.check_call(caller.tenant, caller.user)
    }

    /// Where this cell learns what it owns (the route table, or all).
    pub fn ownership(&self) -> &Arc<dyn Ownership> {
        &self.ownership
    }

    /// Periodic upkeep: forgets idle rate-limit state.
    pub fn maintain(&self) {
        self.limits.prune();
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// A fresh time-ordered id. Rarely (every few seconds) persists a new
    /// reservation first, so ids stay unique across restarts.
    fn next_id(&self, now_ms: u64) -> Result<u64> {
        loop {
            match self.ids.next(now_ms) {
                Next::Id(id) => return Ok(id),
                Next::Reserve(ms) => {
                    let until = ms + ID_RESERVATION_MS;
                    self.store
                        .put_meta_u64_sync(keys::meta::MSG_ID_RESERVED_UNTIL, until)?;
                    self.ids.extend_reservation(until);
                }
            }
        }
    }

    /// The conversation, checked to belong to the caller's tenant.
    fn conversation(&self, caller: &Caller, id: u64) -> Result<Arc<ConvEntry>> {
        let not_found = || CellError::NotFound {
            what: "conversation",
            id,
        };
        let Some(entry) = self.entry(id)? else {
            return Err(self
                .incomplete(caller.tenant, ConversationId(id))
                .unwrap_or_else(not_found));
        };
        // Another tenant's conversation is answered as one that does not
        // exist: the answer must not reveal that the id is taken.
        if entry.tenant != caller.tenant {
            return Err(not_found());
        }
        Ok(entry)
    }

    /// The conversation's in-memory state, loaded from storage on first
    /// use (`None`: not stored here).
    fn entry(&self, id: u64) -> Result<Option<Arc<ConvEntry>>> {
        self.conversations
            .get_or_load(ConversationId(id), || -> Result<_> {
                let Some(record) = self.store.conversation(ConversationId(id))? else {
                    return Ok(None);
                };
                let seq = self.store.conv_seq(ConversationId(id))?;
                let kind = ConversationKind::try_from(record.kind)
                    .unwrap_or(ConversationKind::Unspecified);
                Ok(Some(ConvEntry::new(
                    TenantId(record.tenant_id),
                    kind,
                    SeqState {
                        latest: seq.latest_seq,
                        floor: seq.seq_floor,
                        jumps: seq.jumps,
                    },
                )))
            })
    }

    /// Checks that `conversation` exists in the caller's tenant and that the
    /// caller is a member.
    pub fn check_member(&self, caller: &Caller, conversation: ConversationId) -> Result<()> {
        self.conversation(caller, conversation.get())?;
        self.require_member(caller, conversation)
    }

    /// Checks a member's call about `conversation`: the caller may call,
    /// the conversation exists in its tenant, this cell owns it, and the
    /// caller is a member.
    fn check_member_call(&self, caller: &Caller, conversation: ConversationId) -> Result<()> {
        self.check_call(caller)?;
        self.conversation(caller, conversation.get())?;
        self.ownership
            .check(caller.tenant, conversation, cellmesh_proto::ids::Epoch(0))?;
        self.require_member(caller, conversation)
    }

    /// Refuses a list of seqs that is empty or longer than `max`.
    fn check_seq_list(seqs: &[u64], max: usize) -> Result<()> {
        if seqs.is_empty() || seqs.len() > max {
            return Err(CellError::invalid(
                Reason::BadSeqList,
                format!("name between 1 and {max} seqs"),
            ));
        }
        Ok(())
    }

    fn require_member(&self, caller: &Caller, conversation: ConversationId) -> Result<()> {
        if self.store.is_member(conversation, caller.user)? {
            Ok(())
        } else {
            Err(not_a_member(caller.user, conversation))
        }
    }

    /// Stores the high-water marks `source` pushed here. A conversation
    /// settled here keeps the mark it held when it took it over: a late
    /// push from the cell it took it from must not move the floor it has
    /// built on. One moving away from here takes the marks its target
    /// pushes: should that target fail over back here, the floor must be
    /// above what it may have written (this cell's own latest seq at the
    /// handover plus the margin).
    pub fn store_pushed_marks(
        &self,
        source: &str,
        mut marks: Vec<crate::storage::Mark>,
    ) -> Result<()> {
        self.marks.validate_push(source, &marks)?;
        marks.retain(|&(tenant, conversation, _)| {
            let own = &self.ownership;
            !(own.owns(TenantId(tenant), ConversationId(conversation))
                && own.settled(TenantId(tenant), ConversationId(conversation)))
        });
        self.marks.store_pushed(&marks)
    }

    /// This cell's failover high-water marks.
    pub fn marks(&self) -> &Arc<HighWaterMarks> {
        &self.marks
    }

    pub fn cell_id(&self) -> &str {
        &self.config.cell_id
    }

    /// How this cell dials others (through its `links`).
    pub fn peers(&self) -> cellmesh_route_client::peers::Peers {
        self.config.routing.peers()
    }

    /// Uptime, sends acknowledged, relay lag and route index, for operators.
    pub fn stats(&self) -> Result<(u64, u64, u64, u64)> {
        let stats = self.store.stats();
        let lag = stats
            .outbox_written
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(
                stats
                    .outbox_relayed
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
        Ok((
            self.started.elapsed().as_millis() as u64,
            self.sends.load(std::sync::atomic::Ordering::Relaxed),
            lag,
            self.ownership.route_index().min(i64::MAX as u64),
        ))
    }

    pub fn config(&self) -> &CellConfig {
        &self.config
    }

    /// The route-table index this cell's view has reached (0: standalone).
    pub fn route_index(&self) -> u64 {
        match self.ownership.route_index() {
            u64::MAX => 0,
            index => index,
        }
    }

    fn idempotency_expiry(&self, now_ms: u64) -> u64 {
        now_ms + self.config.idempotency.ttl_secs * 1000
    }
}

fn not_a_member(user: UserId, conversation: ConversationId) -> CellError {
    CellError::denied(
        Reason::NotAMember,
        format!("user {user} is not a member of conversation {conversation}"),
    )
}
