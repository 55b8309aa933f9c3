//! The ownership hook every write passes through. A cell only accepts writes
//! for conversations it owns, at the route epoch it owns them at, and assigns
//! seq above the route's `seq_floor`. Until the route table is consulted, a
//! standalone cell owns everything ([`OwnAll`]).

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::CellError;

/// Where a new conversation goes, from this cell's view of its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// The tenant lives here: its route covers the new conversation.
    Owner,
    /// The tenant is moving here: the conversation needs its own route
    /// before it is stored.
    Place,
}

/// What the route table says about a conversation this cell owns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fence {
    pub epoch: u64,
    /// Seq must be assigned strictly above this.
    pub seq_floor: u64,
    /// And at most this: the high-water mark this cell's standbys
    /// acknowledged plus the failover margin. A cell cut off from its
    /// standbys (its marks no longer land) stops here, below the floor a
    /// failover would give its successor.
    pub seq_limit: Option<u64>,
    /// After a failover: the failed owner's high-water mark this cell
    /// holds. Seqs above it up to the floor are skipped on purpose (a
    /// floor jump, recorded with the first send above the floor).
    pub taken_over_mark: Option<u64>,
}

pub trait Ownership: Send + Sync + 'static {
    /// Checks that this cell owns `conversation` of `tenant`. `caller_epoch`
    /// is the epoch the caller resolved the route at (0 = unknown); a caller
    /// ahead of this cell's view is answered with a retryable error, one on
    /// another cell's route with `WRONG_CELL`.
    fn check(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        caller_epoch: Epoch,
    ) -> Result<Fence, CellError>;

    /// Checks that this cell may serve reads of `conversation` (a frozen
    /// route still serves them); the seq floor its route gives it here (0
    /// while frozen). A cell that took a conversation over in a failover
    /// has this floor before any send stores it locally.
    fn check_read(&self, tenant: TenantId, conversation: ConversationId) -> Result<u64, CellError> {
        self.check(tenant, conversation, Epoch(0))
            .map(|fence| fence.seq_floor)
    }

    /// The route's seq floor of `conversation` here (see
    /// [`check_read`](Self::check_read)), or 0 when this cell cannot serve
    /// it now.
    fn floor(&self, tenant: TenantId, conversation: ConversationId) -> u64 {
        self.check_read(tenant, conversation).unwrap_or(0)
    }

    /// Checks that this cell may create a conversation of `tenant`: its
    /// owner, or the target of the tenant's migration, which must
    /// [`place`](Self::place) the new conversation before storing it.
    fn check_create(&self, tenant: TenantId) -> Result<Creation, CellError> {
        self.check(tenant, ConversationId(0), Epoch(0))
            .map(|_| Creation::Owner)
    }

    /// Routes a conversation about to be created here to this cell (see
    /// [`Creation::Place`]).
    fn place(
        &self,
        _tenant: TenantId,
        _conversation: ConversationId,
    ) -> BoxFuture<'_, Result<(), CellError>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether the route table gives this cell `conversation` now (a
    /// standalone cell follows no table and holds no marks: false).
    fn owns(&self, _tenant: TenantId, _conversation: ConversationId) -> bool {
        false
    }

    /// Whether the route table moves `conversation` of `tenant` to this
    /// cell now (migrating or frozen towards it): the only time copied
    /// history may be stored here. A standalone cell follows no table and
    /// stores what its operator hands it.
    fn moving_here(&self, _tenant: TenantId, _conversation: ConversationId) -> bool {
        true
    }

    /// Whether `conversation` of `tenant` is frozen for a move now (its
    /// writes wait for the switch): background work that competes for the
    /// disk, such as copying files in, holds off meanwhile.
    fn frozen(&self, _tenant: TenantId, _conversation: ConversationId) -> bool {
        false
    }

    /// Whether `conversation` of `tenant` is settled here: owned, active,
    /// no move under way (a standalone cell owns everything for good). Only
    /// settled history is moved to the cold tier or expired.
    fn settled(&self, _tenant: TenantId, _conversation: ConversationId) -> bool {
        true
    }

    /// Whether a cell registered in the route table is reached at
    /// `address`: the only places this cell pulls copies from (a
    /// standalone cell knows no other cell). An address this cell's view
    /// does not know is asked of the routers' leader before it is refused:
    /// the view may lag a registration the caller has already seen.
    fn confirm_cell_address<'a>(
        &'a self,
        _address: &'a str,
    ) -> BoxFuture<'a, Result<bool, CellError>> {
        Box::pin(async { Ok(false) })
    }

    /// The tenants bound to regions whose data this cell may hold (their
    /// regions include its own) that `store_region` lies outside: none of
    /// their bytes may be written there. A standalone cell binds none.
    fn residency_conflicts(&self, _store_region: &str) -> Vec<(TenantId, Vec<String>)> {
        Vec::new()
    }

    /// Whether `tenant`'s bytes may be written to a store in `region`: its
    /// regions, when it is bound to some, include it. A standalone cell
    /// binds none.
    fn may_store_in(&self, _tenant: TenantId, _region: &str) -> bool {
        true
    }

    /// The addresses of the other cells in the route table (a standalone
    /// cell knows none).
    fn other_cells(&self) -> Vec<String> {
        Vec::new()
    }

    /// The address of the cell a failover took `conversation` of `tenant`
    /// from, when the route table gives it to this cell through one (a
    /// standalone cell follows no table: `None`).
    fn taken_over_from(&self, _tenant: TenantId, _conversation: ConversationId) -> Option<String> {
        None
    }

    /// The route-table index this cell's view has reached (a standalone
    /// cell has seen everything).
    fn route_index(&self) -> u64 {
        u64::MAX
    }

    /// Waits at most `timeout` until this cell's view has reached route-table
    /// index `index`; whether it did.
    fn await_route_index(&self, _index: u64, _timeout: Duration) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }
}

/// A standalone cell: owns every conversation, epoch 0, no floor.
pub struct OwnAll;

impl Ownership for OwnAll {
    fn check(
        &self,
        _tenant: TenantId,
        _conversation: ConversationId,
        _caller_epoch: Epoch,
    ) -> Result<Fence, CellError> {
        Ok(Fence::default())
    }
}
