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
//! 5. switch — route to B with `seq_floor` = A's final seq; A answers WRONG_CELL.
//!
//! Cleanup of A's copy after a grace period is not done yet. Whole-tenant
//! moves are in [`tenant`], draining and failing back a cell in [`bulk`].

use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_proto::v1::{CopyRequest, DigestRequest, DigestResponse, MigrationPhase, SealRequest};
use cellmesh_router::client::RouteClient;
use cellmesh_router::commands::update_route;
use cellmesh_router::table::{Key, Phase, RouteState};
use tonic::transport::Channel;

pub mod bulk;
pub mod tenant;

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
            chunk: 1_000,
            catch_up_lag: 50,
            max_catch_up_rounds: 20,
            pause: Duration::ZERO,
            round_messages: 0,
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
    /// How long writes were refused (freeze → switch).
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
}

type Peer = CellPeerClient<Channel>;

fn call(what: &str) -> impl FnOnce(tonic::Status) -> MigrationError + '_ {
    move |status| MigrationError::Call {
        what: what.to_string(),
        status,
    }
}

impl Migrator {
    pub fn new(routes: RouteClient, secret: ClusterSecret, options: MigrationOptions) -> Self {
        Self {
            routes,
            secret,
            options,
        }
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
        let channel = Channel::from_shared(address.clone())
            .map_err(|e| MigrationError::Refused(format!("cell {cell} address {address:?}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        Ok((
            CellPeerClient::new(channel).max_decoding_message_size(64 << 20),
            address,
        ))
    }

    /// Applies one transition of `key` at `expect_epoch`; the new epoch.
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
        self.routes
            .wait_applied(known_epoch, Duration::from_secs(5))
            .await;
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

    /// Source and target digests of the messages in `(after, through]`.
    async fn digests(
        &self,
        source: &mut Peer,
        target: &mut Peer,
        conversation: u64,
        after: u64,
        through: u64,
    ) -> Result<(DigestResponse, DigestResponse), MigrationError> {
        let digest = DigestRequest {
            conversation_id: conversation,
            after_seq: after,
            through_seq: through,
        };
        let a = source
            .conversation_digest(self.request(digest))
            .await
            .map_err(call("source digest"))?
            .into_inner();
        let b = target
            .conversation_digest(self.request(digest))
            .await
            .map_err(call("target digest"))?
            .into_inner();
        Ok((a, b))
    }

    /// Begins moving `key` (decided by `entry`) to `to`, or picks up a move
    /// to `to` already under way; refuses a key that lives on `to` already
    /// or is moving elsewhere.
    async fn begin_or_resume(
        &self,
        key: &Key,
        entry: &cellmesh_router::table::Entry,
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

    /// The entry deciding `key`, read through the route table's leader.
    async fn current_entry(
        &self,
        key: &Key,
    ) -> Result<cellmesh_router::table::Entry, MigrationError> {
        let resolved = self
            .routes
            .resolve_linearizable(key)
            .await
            .map_err(call("route lookup"))?;
        cellmesh_router::grpc::convert::entry_from_pb(resolved.entry.unwrap_or_default())
            .map_err(call("route entry"))
    }

    async fn transition(
        &self,
        key: &Key,
        expect_epoch: u64,
        t: Transition,
    ) -> Result<u64, MigrationError> {
        let applied = self
            .routes
            .apply(update_route(key, expect_epoch, t))
            .await
            .map_err(|status| {
                let d = cellmesh_proto::status::error_detail(&status);
                if d.reason == "STALE_EPOCH" || d.reason == "ILLEGAL_TRANSITION" {
                    MigrationError::Conflict(d.message)
                } else {
                    MigrationError::Call {
                        what: "route write".into(),
                        status,
                    }
                }
            })?;
        // Cells and edges follow the table; give them the change first.
        self.routes
            .wait_applied(applied.index, Duration::from_secs(5))
            .await;
        Ok(applied.index)
    }

    /// Moves `conversation` of `tenant` to cell `to`, or resumes a move that
    /// was interrupted. `progress` sees every copy round.
    pub async fn migrate_conversation(
        &self,
        tenant: u64,
        conversation: u64,
        to: &str,
        mut progress: impl FnMut(&Progress),
    ) -> Result<MigrationReport, MigrationError> {
        let started = Instant::now();
        let key = Key::conversation(tenant, conversation);
        let mut entry = self.current_entry(&key).await?;
        if entry.key != key {
            // No override yet: the conversation sits Active on its tenant's
            // owner, whatever the tenant as a whole is doing.
            entry.state = RouteState::Active;
        }
        let from = entry.cell.clone();
        let start = self.begin_or_resume(&key, &entry, to).await?;
        if start.began {
            self.stop_at(StopPoint::Planned)?;
        }
        let (mut epoch, frozen) = (start.epoch, start.frozen);
        let (mut source, source_address) = self.peer(&from).await?;
        let (mut target, _) = self.peer(to).await?;
        // Copying is idempotent; resume after what the target already has.
        let mut copied = target
            .conversation_digest(self.request(DigestRequest {
                conversation_id: conversation,
                ..Default::default()
            }))
            .await
            .map_err(call("target digest"))?
            .into_inner()
            .latest_seq;
        let copy = |after: u64| CopyRequest {
            source_address: source_address.clone(),
            tenant_id: tenant,
            conversation_id: conversation,
            after_seq: after,
            max_messages: self.options.round_messages,
            chunk: self.options.chunk,
            backfill: false,
        };
        let mut frozen_at = Instant::now();
        let mut pre: Option<(u64, DigestResponse, bool)> = None;
        if !frozen {
            let mut phase = "copy";
            let mut catch_up_rounds = 0;
            for round in 0.. {
                epoch = self
                    .hold_while_paused(&key, to, epoch, copied, &mut progress)
                    .await?;
                let r = target
                    .copy_conversation(self.request(copy(copied)))
                    .await
                    .map_err(call("copy"))?
                    .into_inner();
                let throttled = self.options.round_messages > 0
                    && r.messages >= u64::from(self.options.round_messages);
                copied = r.copied_through.max(copied);
                progress(&Progress {
                    phase,
                    copied_through: copied,
                    source_latest: r.source_latest_seq,
                });
                if round == 0
                    && matches!(
                        entry.state,
                        RouteState::Active
                            | RouteState::Migrating {
                                phase: Phase::Copy,
                                ..
                            }
                    )
                {
                    epoch = self
                        .transition(
                            &key,
                            epoch,
                            Transition::SetPhase(MigrationPhase::CatchUp as i32),
                        )
                        .await?;
                    phase = "catch-up";
                    self.stop_at(StopPoint::Copied)?;
                }
                if r.source_latest_seq.saturating_sub(copied) <= self.options.catch_up_lag {
                    break;
                }
                if !throttled {
                    catch_up_rounds += 1;
                    if catch_up_rounds > self.options.max_catch_up_rounds {
                        break;
                    }
                }
                tokio::time::sleep(self.options.pause).await;
            }
            // Verify what is copied while writes still flow; under the
            // freeze only the final delta is compared then, unless older
            // messages were rewritten in between.
            let (a, b) = self
                .digests(&mut source, &mut target, conversation, 0, copied)
                .await?;
            pre = Some((copied, a, (a.count, a.checksum) == (b.count, b.checksum)));
            epoch = self
                .hold_while_paused(&key, to, epoch, copied, &mut progress)
                .await?;
            frozen_at = Instant::now();
            epoch = self
                .transition(&key, epoch, Transition::Freeze(true))
                .await?;
            self.stop_at(StopPoint::Frozen)?;
        }
        let final_seq = source
            .seal_conversation(self.request(SealRequest {
                tenant_id: tenant,
                conversation_id: conversation,
                epoch,
            }))
            .await
            .map_err(call("seal the source"))?
            .into_inner()
            .latest_seq;
        while copied < final_seq {
            let r = target
                .copy_conversation(self.request(copy(copied)))
                .await
                .map_err(call("final copy"))?
                .into_inner();
            if r.copied_through <= copied {
                break;
            }
            copied = r.copied_through;
        }
        self.stop_at(StopPoint::Sealed)?;
        progress(&Progress {
            phase: "verify",
            copied_through: copied,
            source_latest: final_seq,
        });
        let mut verified = None;
        if let Some((through, before, true)) = pre {
            let (a, b) = self
                .digests(&mut source, &mut target, conversation, through, final_seq)
                .await?;
            if a.rewrites == before.rewrites {
                let sum = |x: &DigestResponse| DigestResponse {
                    count: before.count + x.count,
                    checksum: before.checksum.wrapping_add(x.checksum),
                    ..*x
                };
                verified = Some((sum(&a), sum(&b)));
            }
        }
        let (a, b) = match verified {
            Some(v) => v,
            None => {
                self.digests(&mut source, &mut target, conversation, 0, final_seq)
                    .await?
            }
        };
        if (a.count, a.checksum) != (b.count, b.checksum) {
            self.transition(&key, epoch, Transition::Cancel(true))
                .await
                .ok();
            return Err(MigrationError::Mismatch {
                source_count: a.count,
                source_sum: a.checksum,
                target_count: b.count,
                target_sum: b.checksum,
            });
        }
        let switch_epoch = self
            .transition(&key, epoch, Transition::SwitchFloor(final_seq))
            .await?;
        progress(&Progress {
            phase: "switched",
            copied_through: copied,
            source_latest: final_seq,
        });
        Ok(MigrationReport {
            tenant,
            conversation,
            from,
            to: to.to_string(),
            final_seq,
            messages_verified: a.count,
            frozen_for: frozen_at.elapsed(),
            total: started.elapsed(),
            switch_epoch,
        })
    }
}
