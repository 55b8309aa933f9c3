//! Moving one conversation from its cell A to cell B without losing,
//! duplicating or reordering a message (DESIGN.md §5):
//!
//! 1. plan — route `Migrating{B, Copy}`; A keeps serving;
//! 2. copy — B pulls A's history in checksummed chunks;
//! 3. catch-up — B pulls the delta until it is within `catch_up_lag`;
//! 4. freeze — the history copied so far is verified first (counts and
//!    checksums of A and B), then the route goes `Frozen{B}`; A refuses
//!    writes (the edge retries); A is sealed: it has seen the freeze, every
//!    seq it assigned is durable and no recall or edit is in flight; B pulls
//!    the final delta, and only that delta is verified under the freeze —
//!    all of it again if older messages were rewritten meanwhile;
//! 5. switch — route to B with `seq_floor` = A's final seq; A answers WRONG_CELL;
//! 6. cleanup — after the grace period A drops its copy of the history.
//!
//! The phases are decided by a pure state machine (`engine`) and carried
//! out by `protocol`, shared with user-home moves ([`user`]). A drops its copy itself once `routing.cleanup_grace_secs`
//! have passed since the seal. Whole-tenant moves are in [`tenant`],
//! draining and failing back a cell in [`bulk`].

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_proto::v1::{
    CopyRequest, CopyResponse, DigestRequest, DigestResponse, SealRequest, StoreChunkRequest,
};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::update_route;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::{Entry, Key, Phase, RouteError, RouteState, Scope};
use cellmesh_telemetry::trace::grpc::Channel;

pub mod bulk;
mod engine;
pub mod orphans;
mod protocol;
pub mod tenant;
pub mod user;

use protocol::Subject;

#[derive(Debug, Clone)]
pub struct MigrationOptions {
    /// Messages per copied chunk.
    pub chunk: u32,
    /// Freeze once the target is at most this many messages behind.
    pub catch_up_lag: u64,
    /// Catch-up rounds before freezing anyway.
    pub max_catch_up_rounds: u32,
    /// Pause between copy rounds (throttling).
    pub pause: Duration,
    /// At most this many messages per copy round (throttling; 0 = all the
    /// source has). Throttled rounds do not count as catch-up rounds.
    pub round_messages: u32,
    /// A tenant move copies at most this many messages and sync events
    /// per second (0: no limit).
    pub rate: u64,
    /// A tenant move freezes once the target is at most this many messages
    /// and sync events behind, over all its conversations and homes.
    pub tenant_catch_up_lag: u64,
    /// A tenant move across regions copies the tenant's files at most this
    /// many bytes a second (0: the target cell's own limit only).
    pub file_rate: u64,
    /// A tenant move stops waiting for its files once their copy made no
    /// progress for this long (the target goes on copying).
    pub file_copy_stall: Duration,
    /// Give up right after this point, as if the control plane died there
    /// (drills and tests); running the migration again resumes it.
    pub stop_after: Option<StopPoint>,
}

/// Points at which a migrator can stop (see [`MigrationOptions::stop_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPoint {
    /// The route says Migrating; nothing copied.
    Planned,
    /// The first copy round is stored on the target.
    Copied,
    /// The route is Frozen; the source is not sealed yet.
    Frozen,
    /// The source is sealed and the final delta copied; not yet switched.
    Sealed,
}

impl Default for MigrationOptions {
    fn default() -> Self {
        Self {
            chunk: 10_000,
            catch_up_lag: 50,
            max_catch_up_rounds: 20,
            pause: Duration::ZERO,
            round_messages: 0,
            tenant_catch_up_lag: 500,
            rate: 0,
            file_rate: 0,
            file_copy_stall: Duration::from_secs(300),
            stop_after: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Progress {
    pub phase: &'static str,
    pub copied_through: u64,
    pub source_latest: u64,
}

#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub tenant: u64,
    pub conversation: u64,
    pub from: String,
    pub to: String,
    /// The source's last seq; the target assigns above it.
    pub final_seq: u64,
    pub messages_verified: u64,
    /// How long writes were refused: from the route table's commit of the
    /// freeze to its commit of the switch.
    pub frozen_for: Duration,
    pub total: Duration,
    pub switch_epoch: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("{0}")]
    Refused(String),
    #[error("the route changed under the migration (cancelled or moved by someone else): {0}")]
    Conflict(String),
    #[error(
        "verification failed: source has {source_count} messages (checksum {source_sum:x}), target {target_count} ({target_sum:x}); the migration was rolled back"
    )]
    Mismatch {
        source_count: u64,
        source_sum: u64,
        target_count: u64,
        target_sum: u64,
    },
    #[error("stopped after {0:?} (resume by migrating again)")]
    Stopped(StopPoint),
    #[error("{what}: {status}")]
    Call { what: String, status: tonic::Status },
}

/// Where a move starts from (see [`Migrator::begin_or_resume`]).
struct Start {
    /// The key's epoch to go on from.
    epoch: u64,
    /// The key is frozen already (the move was interrupted past the freeze).
    frozen: bool,
    /// This call began the move.
    began: bool,
}

pub struct Migrator {
    routes: RouteClient,
    secret: ClusterSecret,
    pub options: MigrationOptions,
    /// How cells are dialled (through the deployment's links).
    peers: Peers,
}

type Peer = CellPeerClient<Channel>;

fn call(what: &str) -> impl FnOnce(tonic::Status) -> MigrationError + '_ {
    move |status| MigrationError::Call {
        what: what.to_string(),
        status,
    }
}

impl Migrator {
    /// The route client moves read and write through.
    pub fn routes(&self) -> &RouteClient {
        &self.routes
    }

    pub fn new(routes: RouteClient, secret: ClusterSecret, options: MigrationOptions) -> Self {
        Self {
            routes,
            secret,
            options,
            peers: Peers::default(),
        }
    }

    /// How cells are dialled.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// What calls to cells carry.
    pub fn secret(&self) -> &ClusterSecret {
        &self.secret
    }

    /// This migrator dialling cells through `peers` (the deployment's
    /// links).
    pub fn with_peers(mut self, peers: Peers) -> Self {
        self.peers = peers;
        self
    }

    /// A migrator like this one with other `options`.
    pub fn with_options(&self, options: MigrationOptions) -> Self {
        Self::new(self.routes.clone(), self.secret.clone(), options).with_peers(self.peers.clone())
    }

    fn stop_at(&self, point: StopPoint) -> Result<(), MigrationError> {
        if self.options.stop_after == Some(point) {
            return Err(MigrationError::Stopped(point));
        }
        Ok(())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        self.secret.attach(&mut r);
        r
    }

    async fn peer(&self, cell: &str) -> Result<(CellPeerClient<Channel>, String), MigrationError> {
        let address = self
            .routes
            .read(|t| t.cell(cell).map(|c| c.address.clone()))
            .ok_or_else(|| MigrationError::Refused(format!("unknown cell {cell}")))?;
        let client = (self.peers.cell(&address))
            .map_err(|e| MigrationError::Refused(format!("cell {cell}: {e}")))?;
        Ok((client, address))
    }

    /// Waits until `cell`'s standbys hold the high-water marks of all it
    /// stored: a move switches to it only then, so that a failover of the
    /// new owner right after the switch still puts every floor above the
    /// history it received.
    async fn flush_marks(&self, cell: &str) -> Result<(), MigrationError> {
        let (mut peer, _) = self.peer(cell).await?;
        let mut attempts = 0;
        loop {
            let mut request = self.request(cellmesh_proto::v1::FlushHighWaterMarksRequest {});
            request.set_timeout(Duration::from_secs(15));
            match peer.flush_high_water_marks(request).await {
                Ok(_) => return Ok(()),
                Err(status) if attempts < 3 => {
                    attempts += 1;
                    tracing::warn!(cell, error = %status.message(), "the target's high-water marks are not flushed yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => return Err(call("flush the target's high-water marks")(status)),
            }
        }
    }

    /// Waits while an operator holds the migration of `key` (phase
    /// `Paused`); the entry's current epoch once it may go on.
    async fn hold_while_paused(
        &self,
        key: &Key,
        to: &str,
        known_epoch: u64,
        copied: u64,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<u64, MigrationError> {
        // The cached table must have seen this migrator's own last change.
        self.follow(known_epoch).await;
        let mut reported = false;
        loop {
            let entry = self.routes.read(|t| t.entry(key).cloned());
            match entry {
                Some(e) if matches!(&e.state, RouteState::Migrating { to: t, phase: Phase::Paused } if t == to) =>
                {
                    if !reported {
                        progress(&Progress {
                            phase: "paused",
                            copied_through: copied,
                            source_latest: copied,
                        });
                        reported = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Some(e) if matches!(&e.state, RouteState::Migrating { to: t, .. } if t == to) => {
                    return Ok(e.epoch);
                }
                other => {
                    return Err(MigrationError::Conflict(format!(
                        "{key} is no longer migrating to {to}: {:?}",
                        other.map(|e| e.state)
                    )));
                }
            }
        }
    }

    /// Begins moving `key` (decided by `entry`) to `to`, or picks up a move
    /// to `to` already under way; refuses a key that lives on `to` already
    /// or is moving elsewhere.
    async fn begin_or_resume(
        &self,
        key: &Key,
        entry: &Entry,
        to: &str,
    ) -> Result<Start, MigrationError> {
        let resumed = |target: &str, frozen| {
            if target != to {
                return Err(MigrationError::Refused(format!(
                    "{key} is already migrating to {target}; cancel that first"
                )));
            }
            Ok(Start {
                epoch: entry.epoch,
                frozen,
                began: false,
            })
        };
        match &entry.state {
            RouteState::Active if entry.cell == to => Err(MigrationError::Refused(format!(
                "{key} already lives on {to}"
            ))),
            RouteState::Active => Ok(Start {
                epoch: self
                    .transition(key, entry.epoch, Transition::BeginMigration(to.to_string()))
                    .await?,
                frozen: false,
                began: true,
            }),
            RouteState::Migrating { to: t, .. } => resumed(t, false),
            RouteState::Frozen { to: t } => resumed(t, true),
        }
    }

    /// Reads `key`'s entry, begins or resumes its move to `to`, and opens
    /// both cells; the state the entry was read in.
    async fn open_move(
        &self,
        key: &Key,
        to: &str,
    ) -> Result<(RouteState, Start, Ends), MigrationError> {
        let mut entry = self.current_entry(key).await?;
        if entry.key != *key {
            // No override yet: the key sits Active on its tenant's owner,
            // whatever the tenant as a whole is doing.
            entry.state = RouteState::Active;
        }
        let (mut source, source_address) = self.peer(&entry.cell).await?;
        // A failback is exempt: its target holds what the source lacks.
        if let Scope::Conversation(conversation) = key.scope
            && entry.state == RouteState::Active
            && entry.cell != to
            && entry.floor_margin > 0
            && entry.failed_from.as_deref() != Some(to)
        {
            self.refuse_unbackfilled(key, ConversationId(conversation), &entry, &mut source)
                .await?;
        }
        let start = self.begin_or_resume(key, &entry, to).await?;
        if start.began {
            self.stop_at(StopPoint::Planned)?;
        }
        let (target, _) = self.peer(to).await?;
        let ends = Ends {
            from: entry.cell,
            source,
            source_address,
            target,
        };
        Ok((entry.state, start, ends))
    }

    /// Refuses to begin moving a conversation a failover gave its owner
    /// to a third cell while history the failed cell acknowledged has not
    /// been backfilled into it: the backfill goes to the owner the failover
    /// made, and the move would leave that history behind for good (or
    /// race it into the source behind the copy).
    async fn refuse_unbackfilled(
        &self,
        key: &Key,
        conversation: ConversationId,
        entry: &Entry,
        source: &mut Peer,
    ) -> Result<(), MigrationError> {
        // Past every seq: no message is read, only the answer's flags.
        let probe = DigestRequest {
            conversation_id: conversation.get(),
            after_seq: u64::MAX,
            through_seq: u64::MAX,
        };
        let digest = source
            .conversation_digest(self.request(probe))
            .await
            .map_err(call("source digest"))?
            .into_inner();
        if digest.awaiting_backfill {
            let failed = entry.failed_from.as_deref().unwrap_or("the failed cell");
            return Err(MigrationError::Refused(format!(
                "{key} awaits the backfill of the history {failed} acknowledged before it failed over to {}; move it once that cell has returned and been backfilled",
                entry.cell
            )));
        }
        Ok(())
    }

    /// The entry deciding `key`, read through the route table's leader.
    async fn current_entry(&self, key: &Key) -> Result<Entry, MigrationError> {
        let entry = self.routes.current_entry(key).await;
        let no_route = || RouteError::NoRoute(key.to_string()).to_status();
        entry
            .and_then(|e| e.ok_or_else(no_route))
            .map_err(call("route lookup"))
    }

    /// Applies one transition and waits until this migrator's view of the
    /// table has it; the new epoch.
    async fn transition(
        &self,
        key: &Key,
        expect_epoch: u64,
        t: Transition,
    ) -> Result<u64, MigrationError> {
        let epoch = self.commit(key, expect_epoch, t).await?;
        self.follow(epoch).await;
        Ok(epoch)
    }

    /// Waits (bounded) until this migrator's view of the table has `epoch`:
    /// cells and edges follow the table; they get the change first.
    async fn follow(&self, epoch: u64) {
        self.routes
            .wait_applied(epoch, Duration::from_secs(5))
            .await;
    }

    /// Applies one transition of `key` at `expect_epoch`, returning as soon
    /// as the route table committed it; the new epoch.
    async fn commit(
        &self,
        key: &Key,
        expect_epoch: u64,
        t: Transition,
    ) -> Result<u64, MigrationError> {
        let own = |entry: &Entry| reached(key, entry, &t);
        self.commit_recognised(key, expect_epoch, t.clone(), own)
            .await
    }

    /// Switches `key`, frozen at `expect_epoch` on its way to `to`, with
    /// seq floor `seq_floor`; the switch's epoch.
    async fn commit_switch(
        &self,
        key: &Key,
        expect_epoch: u64,
        seq_floor: u64,
        to: &str,
    ) -> Result<u64, MigrationError> {
        let own = |entry: &Entry| switched(key, entry, to, seq_floor);
        self.commit_recognised(key, expect_epoch, Transition::SwitchFloor(seq_floor), own)
            .await
    }

    /// [`Self::commit`], taking an entry past `expect_epoch` for which `own`
    /// holds as this very write committed (its answer lost, the route
    /// client's retry refused).
    async fn commit_recognised(
        &self,
        key: &Key,
        expect_epoch: u64,
        t: Transition,
        own: impl Fn(&Entry) -> bool,
    ) -> Result<u64, MigrationError> {
        let command = update_route(key, expect_epoch, t);
        let status = match self
            .routes
            .apply_recognised(command, key, expect_epoch, own)
            .await
        {
            Ok(epoch) => return Ok(epoch),
            Err(status) => status,
        };
        let d = cellmesh_proto::status::error_detail(&status);
        if matches!(
            d.known_reason(),
            Some(Reason::StaleEpoch | Reason::IllegalTransition)
        ) {
            return Err(MigrationError::Conflict(d.message));
        }
        Err(MigrationError::Call {
            what: "route write".into(),
            status,
        })
    }

    /// Moves `conversation` of `tenant` to cell `to`, or resumes a move that
    /// was interrupted. `progress` sees every copy round.
    pub async fn migrate_conversation(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        to: &str,
        mut progress: impl FnMut(&Progress),
    ) -> Result<MigrationReport, MigrationError> {
        let started = Instant::now();
        let key = Key::conversation(tenant, conversation);
        let (state, start, ends) = self.open_move(&key, to).await?;
        let from = ends.from.clone();
        let mut subject = ConversationMove {
            migrator: self,
            tenant: tenant.get(),
            conversation: conversation.get(),
            ends,
        };
        let moved = self
            .run_move(&key, &state, start, &mut subject, to, &mut progress)
            .await?;
        Ok(MigrationReport {
            tenant: tenant.get(),
            conversation: conversation.get(),
            from,
            to: to.to_string(),
            final_seq: moved.final_position,
            messages_verified: moved.verified,
            frozen_for: moved.frozen_for,
            total: started.elapsed(),
            switch_epoch: moved.switch_epoch,
        })
    }
}

/// The two cells of a move.
struct Ends {
    from: String,
    source: Peer,
    source_address: String,
    target: Peer,
}

/// Source and target answers to the same digest request (asked at once),
/// or the first failure.
fn both(
    source: Result<tonic::Response<DigestResponse>, tonic::Status>,
    target: Result<tonic::Response<DigestResponse>, tonic::Status>,
) -> Result<(DigestResponse, DigestResponse), MigrationError> {
    Ok((
        source.map_err(call("source digest"))?.into_inner(),
        target.map_err(call("target digest"))?.into_inner(),
    ))
}

/// A conversation's history on the move.
struct ConversationMove<'a> {
    migrator: &'a Migrator,
    tenant: u64,
    conversation: u64,
    ends: Ends,
}

impl Subject for ConversationMove<'_> {
    const EXACT_LATEST: bool = false;

    async fn resume_point(&mut self, start: &Start) -> Result<u64, MigrationError> {
        // A move that begins now copies everything: a target that owned the
        // conversation once (a failed owner that returned) holds a copy
        // that may differ from the source's.
        if start.began {
            return Ok(0);
        }
        // Copying is idempotent; resume after what the target already has.
        let digest = DigestRequest {
            conversation_id: self.conversation,
            ..Default::default()
        };
        Ok(self
            .ends
            .target
            .conversation_digest(self.migrator.request(digest))
            .await
            .map_err(call("target digest"))?
            .into_inner()
            .latest_seq)
    }

    async fn copy(&mut self, after: u64) -> Result<CopyResponse, MigrationError> {
        let options = &self.migrator.options;
        let copy = CopyRequest {
            source_address: self.ends.source_address.clone(),
            tenant_id: self.tenant,
            conversation_id: self.conversation,
            after_seq: after,
            max_messages: options.round_messages,
            chunk: options.chunk,
            backfill: false,
        };
        Ok(self
            .ends
            .target
            .copy_conversation(self.migrator.request(copy))
            .await
            .map_err(call("copy"))?
            .into_inner())
    }

    async fn digests(
        &mut self,
        after: u64,
        through: u64,
    ) -> Result<(DigestResponse, DigestResponse), MigrationError> {
        let digest = DigestRequest {
            conversation_id: self.conversation,
            after_seq: after,
            through_seq: through,
        };
        let (m, ends) = (self.migrator, &mut self.ends);
        let (a, b) = tokio::join!(
            ends.source.conversation_digest(m.request(digest)),
            ends.target.conversation_digest(m.request(digest))
        );
        both(a, b)
    }

    /// The source answers the seal with the final delta's first chunk,
    /// which goes to the target from here: no trip from target to source
    /// under the freeze.
    async fn seal(&mut self, epoch: u64, copied: u64) -> Result<(u64, u64), MigrationError> {
        let seal = SealRequest {
            tenant_id: self.tenant,
            conversation_id: self.conversation,
            epoch,
            delta_limit: self.migrator.options.chunk,
            delta_after_seq: copied,
            ..Default::default()
        };
        let sealed = self
            .ends
            .source
            .seal_conversation(self.migrator.request(seal))
            .await
            .map_err(call("seal the source"))?
            .into_inner();
        let Some(delta) =
            (sealed.delta).filter(|d| !d.messages.is_empty() || !d.uploads.is_empty())
        else {
            return Ok((sealed.latest_seq, copied));
        };
        let store = StoreChunkRequest {
            tenant_id: self.tenant,
            conversation_id: self.conversation,
            chunk: Some(delta),
        };
        let stored = self
            .ends
            .target
            .store_conversation_chunk(self.migrator.request(store))
            .await
            .map_err(call("store the final delta"))?
            .into_inner();
        Ok((sealed.latest_seq, stored.copied_through.max(copied)))
    }

    fn switch_floor(&self, final_position: u64) -> u64 {
        final_position
    }
}

/// Whether `entry` is what a switch of `key` to `to` with `seq_floor`
/// left: Active on `to`, the floor at least `seq_floor`, no failover's
/// mark. A cancel leaves the key on its source, a failover its mark.
fn switched(key: &Key, entry: &Entry, to: &str, seq_floor: u64) -> bool {
    entry.key == *key
        && entry.state == RouteState::Active
        && entry.cell == to
        && entry.seq_floor >= seq_floor
        && entry.floor_margin == 0
        && entry.failed_from.is_none()
}

/// Whether `entry` is the state transition `t` of `key` leads to, for the
/// transitions whose result names itself (a switch and a cancel both end
/// Active: a switch is told by [`switched`]).
fn reached(key: &Key, entry: &Entry, t: &Transition) -> bool {
    if entry.key != *key {
        return false;
    }
    match (t, &entry.state) {
        (Transition::BeginMigration(to), RouteState::Migrating { to: t, phase }) => {
            t == to && *phase == Phase::Copy
        }
        (Transition::SetPhase(p), RouteState::Migrating { phase, .. }) => {
            cellmesh_route_client::convert::phase_to_pb(*phase) as i32 == *p
        }
        (Transition::Freeze(true), RouteState::Frozen { .. }) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::v1::MigrationPhase;

    fn entry(key: Key, state: RouteState) -> Entry {
        Entry {
            key,
            cell: "eu-west/c1".into(),
            epoch: 16,
            state,
            seq_floor: 0,
            floor_margin: 0,
            failed_from: None,
            regions: Vec::new(),
        }
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_recognised_by_the_state_it_left() {
        let conv = Key::conversation(TenantId(1), ConversationId(7));
        let migrating = |phase| RouteState::Migrating {
            to: "us-east/c1".into(),
            phase,
        };
        let begin = Transition::BeginMigration("us-east/c1".into());
        assert!(reached(&conv, &entry(conv, migrating(Phase::Copy)), &begin));
        // Another target, a later phase, the tenant's entry, or still Active:
        // someone else's write.
        let elsewhere = RouteState::Migrating {
            to: "ap-south/c1".into(),
            phase: Phase::Copy,
        };
        assert!(!reached(&conv, &entry(conv, elsewhere), &begin));
        assert!(!reached(
            &conv,
            &entry(conv, migrating(Phase::CatchUp)),
            &begin
        ));
        assert!(!reached(
            &conv,
            &entry(Key::tenant(TenantId(1)), migrating(Phase::Copy)),
            &begin
        ));
        assert!(!reached(&conv, &entry(conv, RouteState::Active), &begin));

        let catch_up = Transition::SetPhase(MigrationPhase::CatchUp as i32);
        assert!(reached(
            &conv,
            &entry(conv, migrating(Phase::CatchUp)),
            &catch_up
        ));
        assert!(!reached(
            &conv,
            &entry(conv, migrating(Phase::Copy)),
            &catch_up
        ));

        let frozen = RouteState::Frozen {
            to: "us-east/c1".into(),
        };
        assert!(reached(
            &conv,
            &entry(conv, frozen),
            &Transition::Freeze(true)
        ));
        assert!(!reached(
            &conv,
            &entry(conv, RouteState::Active),
            &Transition::Freeze(true)
        ));
        // A cancel ends Active: never taken as ours.
        assert!(!reached(
            &conv,
            &entry(conv, RouteState::Active),
            &Transition::Cancel(true)
        ));
    }

    #[test]
    fn a_switch_whose_answer_was_lost_is_recognised_by_its_owner_and_floor() {
        let conv = Key::conversation(TenantId(1), ConversationId(7));
        let on = |cell: &str, floor| Entry {
            cell: cell.into(),
            seq_floor: floor,
            ..entry(conv, RouteState::Active)
        };
        assert!(switched(&conv, &on("us-east/c1", 40), "us-east/c1", 40));
        assert!(switched(&conv, &on("us-east/c1", 90), "us-east/c1", 40));
        // A cancel leaves the key on its source.
        assert!(!switched(&conv, &on("eu-west/c1", 40), "us-east/c1", 40));
        // Below the floor, still moving, failed over, or another key's entry.
        assert!(!switched(&conv, &on("us-east/c1", 39), "us-east/c1", 40));
        let frozen = Entry {
            state: RouteState::Frozen {
                to: "us-east/c1".into(),
            },
            ..on("us-east/c1", 40)
        };
        assert!(!switched(&conv, &frozen, "us-east/c1", 40));
        let failed_over = Entry {
            floor_margin: 1_000,
            failed_from: Some("eu-west/c1".into()),
            ..on("us-east/c1", 40)
        };
        assert!(!switched(&conv, &failed_over, "us-east/c1", 40));
        let tenant = Entry {
            key: Key::tenant(TenantId(1)),
            ..on("us-east/c1", 40)
        };
        assert!(!switched(&conv, &tenant, "us-east/c1", 40));
    }
}
