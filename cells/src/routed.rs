//! Ownership and user homes from the route table. A cell in a deployment
//! follows the table through a route client and answers, for every write,
//! whether it owns the conversation at the caller's epoch: `WRONG_CELL` with
//! the current route when another cell does, `RETRY_LATER` while the route
//! is frozen for a migration or when the caller has seen a newer epoch than
//! this cell. Users whose home is another cell get their events there.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::RouteState as PbRouteState;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::convert::route_to_pb;
use cellmesh_route_client::table::{Entry, Key, RouteState};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::CellError;
use crate::homes::{Home, Homes, Owner};
use crate::hwm::HighWaterMarks;
use crate::ownership::{Creation, Fence, Ownership};
use crate::takeover::Takeovers;
use crate::user::UserKey;
use futures::future::BoxFuture;

/// How soon a failed owner-lease renewal is tried again.
const RENEW_RETRY: Duration = Duration::from_millis(100);

pub struct Routed {
    client: RouteClient,
    cell_id: String,
    /// The failover safety margin (from this cell's rate limits and
    /// checkpoint interval): how far past the high-water mark its standbys
    /// acknowledged it may write.
    margin: u64,
    /// The marks fenced on, and the marks held for other cells (the floors
    /// of conversations failed over here).
    marks: Arc<HighWaterMarks>,
    /// Writes need a confirmation from the route table's leader younger
    /// than this (`None`: no lease).
    lease: Option<Duration>,
    /// When the last confirmation was asked for.
    confirmed: std::sync::Mutex<Option<Instant>>,
    /// Routes a failover moved here, and when this cell learned of each.
    takeovers: Arc<Takeovers>,
}

impl Routed {
    pub fn new(
        client: RouteClient,
        cell_id: String,
        margin: u64,
        lease: Option<Duration>,
        marks: Arc<HighWaterMarks>,
    ) -> Self {
        Self {
            client,
            cell_id,
            margin,
            marks,
            lease,
            confirmed: std::sync::Mutex::new(None),
            takeovers: Default::default(),
        }
    }

    /// Notes the routes a failover moves here as the cache applies them,
    /// until `routed` is dropped.
    pub async fn watch_takeovers(routed: std::sync::Weak<Self>) {
        let Some((takeovers, changes, cell)) = routed.upgrade().map(|r| {
            (
                Arc::downgrade(&r.takeovers),
                r.client.changes(),
                r.cell_id.clone(),
            )
        }) else {
            return;
        };
        // Weak: the watch must not keep the route client alive.
        let snapshot = move || {
            (routed.upgrade())
                .map(|r| r.client.read(|t| t.as_changes()))
                .unwrap_or_default()
        };
        Takeovers::watch(takeovers, changes, cell, snapshot).await;
    }

    /// Renews the owner lease until `self` is dropped: a linearizable
    /// lookup of something this cell owns (the leader, with a quorum,
    /// answers), applied locally, extends it from the moment it was asked.
    pub async fn keep_lease(routed: std::sync::Weak<Self>) {
        loop {
            let Some(this) = routed.upgrade() else {
                return;
            };
            let Some(lease) = this.lease else {
                return;
            };
            let asked = Instant::now();
            let owned = this.client.read(|t| {
                t.routes
                    .values()
                    .find(|e| e.cell == this.cell_id)
                    .map(|e| e.key)
            });
            let confirmed = match owned {
                // Owning nothing, it writes nothing: nothing to confirm.
                None => true,
                Some(key) => {
                    // Asked of every replica at once: whichever leads now
                    // answers, a hung one is not waited for.
                    let lookup = this.client.resolve_linearizable_any(&key);
                    match tokio::time::timeout(lease * 3 / 4, lookup).await {
                        Ok(Ok(r)) => {
                            let index = r.applied_index;
                            // The watch lags (a replica it follows may
                            // hang): copy the table from the leader.
                            let caught_up = this.client.wait_applied(index, lease / 8).await
                                || (this.client.catch_up().await.is_ok()
                                    && this.client.wait_applied(index, lease / 8).await);
                            // Marked Degraded or Down (fenced): no renewal
                            // answered after the mark counts, so one lease
                            // after it this cell writes no more.
                            caught_up && !this.fenced()
                        }
                        _ => false,
                    }
                }
            };
            if confirmed {
                *this.confirmed.lock().expect("lease") = Some(asked);
            }
            drop(this);
            // A failed renewal is tried again at once: while the table
            // elects a new leader, the lease must be renewed from it
            // before it runs out.
            let pause = if confirmed { lease / 4 } else { RENEW_RETRY };
            tokio::time::sleep(pause).await;
        }
    }

    /// Whether this cell owns `conversation` (0: the tenant) now, and the
    /// bounds its writes keep there; `write`: for a write, which a route
    /// failed over here also waits for (see [`Takeovers::check`]).
    fn fence(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        caller_epoch: Epoch,
        write: bool,
    ) -> Result<Fence, CellError> {
        let (tenant, conversation, caller_epoch) =
            (tenant.get(), conversation.get(), caller_epoch.get());
        let key = if conversation == 0 {
            Key::tenant(TenantId(tenant))
        } else {
            Key::conversation(TenantId(tenant), ConversationId(conversation))
        };
        let route = self.client.read(|t| t.resolve(&key));
        let Some(route) = route else {
            return Err(CellError::RetryLater {
                reason: Reason::NoRoute,
                message: format!("tenant {tenant} has no placement in the route table"),
                retry_after: Duration::from_millis(500),
            });
        };
        if route.entry.cell != self.cell_id {
            return Err(wrong_cell(&key, &route));
        }
        if caller_epoch > route.entry.epoch && caller_epoch > self.client.applied() {
            return Err(CellError::RetryLater {
                reason: Reason::RouteBehind,
                message: format!(
                    "the caller routed at epoch {caller_epoch}; this cell has seen {}",
                    self.client.applied()
                ),
                retry_after: Duration::from_millis(50),
            });
        }
        self.lease_check()?;
        if write && let Some(lease) = self.lease {
            // Every cell's announced lease is read only for a route taken
            // over, not on every send.
            let longest = || {
                let announced = self.client.read(|t| {
                    (t.cells.values())
                        .map(|c| c.owner_lease_ms)
                        .max()
                        .unwrap_or(0)
                });
                Duration::from_millis(announced).max(lease)
            };
            (self.takeovers).check(&self.cell_id, &route.entry, longest)?;
        }
        if matches!(route.entry.state, RouteState::Frozen { .. }) {
            return Err(CellError::RetryLater {
                reason: Reason::Frozen,
                message: format!("{key} is frozen for a migration"),
                retry_after: Duration::from_millis(100),
            });
        }
        let mut seq_floor = route.seq_floor;
        let mut taken_over_mark = None;
        if conversation != 0 && route.entry.floor_margin > 0 {
            // Failed over here: above what the failed owner may have built
            // on, as this cell holds its mark.
            let held = self
                .marks
                .held(TenantId(tenant), ConversationId(conversation))?;
            seq_floor = seq_floor.max(held.saturating_add(route.entry.floor_margin));
            taken_over_mark = Some(held);
        }
        Ok(Fence {
            epoch: route.entry.epoch,
            seq_floor,
            seq_limit: (conversation != 0).then(|| {
                self.marks
                    .acked(ConversationId(conversation))
                    .saturating_add(self.margin)
            }),
            taken_over_mark,
        })
    }

    /// Whether the table (as far as this cell has applied it) fences this
    /// cell: marks it Degraded or Down.
    fn fenced(&self) -> bool {
        self.client
            .read(|t| t.cell(&self.cell_id).is_some_and(|c| c.status.fenced()))
    }

    fn lease_check(&self) -> Result<(), CellError> {
        if self.lease_holds() {
            return Ok(());
        }
        Err(CellError::RetryLater {
            reason: Reason::OwnerLeaseExpired,
            message: "the route table has not confirmed this cell's view lately".into(),
            retry_after: Duration::from_millis(200),
        })
    }

    fn lease_holds(&self) -> bool {
        self.lease.is_none_or(|lease| {
            self.confirmed
                .lock()
                .expect("lease")
                .is_some_and(|at| at.elapsed() < lease)
        })
    }
}

impl Ownership for Routed {
    fn residency_conflicts(&self, store_region: &str) -> Vec<(TenantId, Vec<String>)> {
        let mine = crate::config::region_of(&self.cell_id);
        self.client.read(|t| {
            (t.routes.values())
                .filter(|e| !e.key.is_override() && !e.regions.is_empty())
                .filter(|e| e.regions.iter().any(|r| r == mine))
                .filter(|e| !e.regions.iter().any(|r| r == store_region))
                .map(|e| (e.key.tenant, e.regions.clone()))
                .collect()
        })
    }

    fn may_store_in(&self, tenant: TenantId, region: &str) -> bool {
        self.client.read(|t| {
            let regions = t.regions_of(tenant);
            regions.is_empty() || regions.iter().any(|r| r == region)
        })
    }

    fn owns(&self, tenant: TenantId, conversation: ConversationId) -> bool {
        self.client.read(|t| {
            t.resolve(&Key::conversation(tenant, conversation))
                .is_some_and(|r| r.entry.cell == self.cell_id)
        })
    }

    fn route_index(&self) -> u64 {
        self.client.applied()
    }

    fn taken_over_from(&self, tenant: TenantId, conversation: ConversationId) -> Option<String> {
        self.client.read(|t| {
            let entry = t.effective(&Key::conversation(tenant, conversation))?;
            // A chain of failovers back here names this cell itself.
            let failed = (entry.failed_from.as_ref())
                .filter(|f| entry.cell == self.cell_id && **f != self.cell_id)?;
            Some(t.cell(failed)?.address.clone())
        })
    }

    fn moving_here(&self, tenant: TenantId, conversation: ConversationId) -> bool {
        let route = self
            .client
            .read(|t| t.resolve(&Key::conversation(tenant, conversation)));
        route.is_some_and(|r| match &r.entry.state {
            RouteState::Migrating { to, .. } | RouteState::Frozen { to } => *to == self.cell_id,
            RouteState::Active => false,
        })
    }

    fn frozen(&self, tenant: TenantId, conversation: ConversationId) -> bool {
        let route = self
            .client
            .read(|t| t.resolve(&Key::conversation(tenant, conversation)));
        route.is_some_and(|r| frozen_route(&r))
    }

    fn settled(&self, tenant: TenantId, conversation: ConversationId) -> bool {
        let route = self
            .client
            .read(|t| t.resolve(&Key::conversation(tenant, conversation)));
        route.is_some_and(|r| {
            matches!(r.entry.state, RouteState::Active) && r.entry.cell == self.cell_id
        })
    }

    fn other_cells(&self) -> Vec<String> {
        self.client.read(|t| {
            (t.cells.values())
                .filter(|c| c.id != self.cell_id && !c.address.is_empty())
                .map(|c| c.address.clone())
                .collect()
        })
    }

    fn confirm_cell_address<'a>(
        &'a self,
        address: &'a str,
    ) -> BoxFuture<'a, Result<bool, CellError>> {
        let known = move || {
            self.client
                .read(|t| t.cells.values().any(|c| c.address == address))
        };
        Box::pin(async move {
            if known() {
                return Ok(true);
            }
            // A linearizable copy of the table holds every registration
            // that completed before this call.
            self.client
                .catch_up()
                .await
                .map_err(|e| CellError::RetryLater {
                    reason: Reason::RouteBehind,
                    message: format!("cannot confirm that {address} is a cell: {}", e.message()),
                    retry_after: Duration::from_millis(500),
                })?;
            Ok(known())
        })
    }

    fn await_route_index(&self, index: u64, timeout: Duration) -> BoxFuture<'_, bool> {
        Box::pin(self.client.wait_applied(index, timeout))
    }

    fn check_read(&self, tenant: TenantId, conversation: ConversationId) -> Result<u64, CellError> {
        match self.fence(tenant, conversation, Epoch(0), false) {
            Err(CellError::RetryLater {
                reason: Reason::Frozen,
                ..
            }) => Ok(0),
            other => other.map(|fence| fence.seq_floor),
        }
    }

    fn check(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        caller_epoch: Epoch,
    ) -> Result<Fence, CellError> {
        self.fence(tenant, conversation, caller_epoch, true)
    }

    fn check_create(&self, typed: TenantId) -> Result<Creation, CellError> {
        let tenant = typed.get();
        let key = Key::tenant(TenantId(tenant));
        // A tenant creates where it lives, or on its migration's target.
        let moving = self.client.read(|t| {
            let route = t.resolve(&key)?;
            let target = t.creation_cell(TenantId(tenant))?;
            (target.id != route.entry.cell)
                .then(|| (target.id.clone(), target.address.clone(), route))
        });
        let Some((to, address, route)) = moving else {
            return self
                .check(typed, ConversationId(0), Epoch(0))
                .map(|_| Creation::Owner);
        };
        if to == self.cell_id {
            self.lease_check()?;
            return Ok(Creation::Place);
        }
        let mut pb = route_to_pb(&route);
        pb.cell_address = address;
        pb.cell_id = to.clone();
        Err(CellError::WrongCell {
            message: format!("tenant {tenant} is moving: new conversations are created on {to}"),
            route: Box::new(pb),
        })
    }

    fn place(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> BoxFuture<'_, Result<(), CellError>> {
        Box::pin(async move {
            let key = Key::tenant(tenant);
            let mut attempt = 0;
            loop {
                let Some((epoch, state, cell)) = self.client.read(|t| {
                    t.entry(&key)
                        .map(|e| (e.epoch, e.state.clone(), e.cell.clone()))
                }) else {
                    return Err(CellError::RetryLater {
                        reason: Reason::NoRoute,
                        message: format!("tenant {tenant} has no placement"),
                        retry_after: Duration::from_millis(500),
                    });
                };
                // The tenant finished moving here meanwhile: its own route
                // covers the new conversation.
                if state == RouteState::Active && cell == self.cell_id {
                    return Ok(());
                }
                let placed = Key::conversation(tenant, conversation);
                let command = cellmesh_route_client::commands::update_route(
                    &placed,
                    epoch,
                    cellmesh_proto::v1::update_route::Transition::Place(self.cell_id.clone()),
                );
                // A retry of a write that committed with its answer lost
                // finds the conversation's own route here: that is this
                // write's.
                let here = |e: &Entry| e.cell == self.cell_id;
                match self
                    .client
                    .apply_recognised(command, &placed, epoch, here)
                    .await
                {
                    Ok(index) => {
                        // This cell's own view must cover the new route.
                        self.client
                            .wait_applied(index, Duration::from_secs(5))
                            .await;
                        return Ok(());
                    }
                    // The tenant entry moved on (frozen, switched) since this
                    // cell read it: catch up and try again.
                    Err(_) if attempt < 5 => {
                        attempt += 1;
                        self.client.refresh(epoch + 1).await.ok();
                    }
                    Err(status) => {
                        return Err(CellError::RetryLater {
                            reason: Reason::PlacementFailed,
                            message: format!(
                                "could not route the new conversation here: {}",
                                status.message()
                            ),
                            retry_after: Duration::from_millis(200),
                        });
                    }
                }
            }
        })
    }
}

impl Homes for Routed {
    fn home(&self, user: UserKey) -> Home {
        let key = Key::user(user.tenant, user.user);
        let Some(route) = self.client.resolve(&key) else {
            return Home::Here;
        };
        if frozen_route(&route) {
            Home::Moving
        } else if route.entry.cell == self.cell_id {
            Home::Here
        } else {
            Home::Remote(route.cell_address)
        }
    }

    fn check_home(&self, user: UserKey, write: bool) -> Result<(), CellError> {
        let key = Key::user(user.tenant, user.user);
        let Some(route) = self.client.resolve(&key) else {
            return Ok(());
        };
        if route.entry.cell != self.cell_id {
            return Err(wrong_cell(&key, &route));
        }
        if write && frozen_route(&route) {
            return Err(CellError::RetryLater {
                reason: Reason::Frozen,
                message: format!("{key} is frozen for a move of the user's home"),
                retry_after: Duration::from_millis(100),
            });
        }
        Ok(())
    }

    fn conversation_owner(&self, tenant: TenantId, conversation: ConversationId) -> Option<Owner> {
        self.client
            .resolve(&Key::conversation(tenant, conversation))
            .map(|route| Owner {
                incoming: match route.entry.state {
                    RouteState::Migrating { to, .. } | RouteState::Frozen { to } => Some(to),
                    RouteState::Active => None,
                },
                cell: route.entry.cell,
            })
    }

    fn route_index(&self) -> u64 {
        self.client.applied()
    }

    fn standbys(&self) -> Vec<String> {
        self.client.read(|t| {
            t.standbys_for(&self.cell_id)
                .into_iter()
                .map(|c| c.address.clone())
                .collect()
        })
    }

    fn may_hold(&self, tenant: TenantId, endpoint: &str) -> bool {
        self.client.read(|t| {
            t.regions_of(tenant).is_empty()
                || (t.cells.values())
                    .find(|c| c.address == endpoint)
                    .is_some_and(|c| t.allows(tenant, &c.id))
        })
    }
}

/// Whether a key (a user's home, a conversation) is frozen for a move: of
/// its own, or of its tenant (whose entry it follows) under the tenant's
/// freeze.
fn frozen_route(route: &cellmesh_route_client::table::Resolved) -> bool {
    matches!(route.entry.state, RouteState::Frozen { .. })
}

/// `WRONG_CELL` for `key`, carrying the route that owns it.
fn wrong_cell(key: &Key, route: &cellmesh_route_client::table::Resolved) -> CellError {
    let mut pb = route_to_pb(route);
    if pb.state == PbRouteState::Unspecified as i32 {
        pb.state = PbRouteState::Active as i32;
    }
    CellError::WrongCell {
        message: format!("{key} is owned by {}", route.entry.cell),
        route: Box::new(pb),
    }
}
