//! The rounds that push this cell's high-water marks to its standbys and
//! keep its holder list in the route table true (see the parent module).
//!
//! Each round: holders that stopped being standbys leave the list first (no
//! mark is acknowledged without them while they are listed); a standby
//! without a complete copy (new, or every standby after a restart or after
//! a failover gave this cell conversations) gets a full push — every
//! conversation stored here, and the floor of every conversation taken
//! over; then every standby gets the marks written since the last round.
//! Only when all of them stored all of it are the marks acknowledged (the
//! fence moves) and the standbys listed as holders.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{HighWaterMark, HighWaterMarks as PbMarks};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::{Key, RouteState};
use cellmesh_telemetry::trace::grpc::Channel;

use super::HighWaterMarks;
use crate::storage::Mark;

/// Marks per call to a standby (about 30 bytes each).
const PUSH_BATCH: usize = 10_000;
/// Conversations read per page of a full push.
const SCAN_PAGE: usize = 10_000;

pub struct Rounds {
    pub marks: Arc<HighWaterMarks>,
    pub routes: RouteClient,
    pub cell_id: String,
    pub secret: ClusterSecret,
    pub peers: cellmesh_route_client::peers::Peers,
    pub timeout: Duration,
    /// Standbys that received a full push and every round since.
    confirmed: BTreeSet<String>,
    /// Routes this cell took over in a failover, as of the last round.
    taken_over: BTreeSet<(Key, u64)>,
}

/// What a round reads of the route table.
struct View {
    /// (id, address) of each standby.
    standbys: Vec<(String, String)>,
    holders: Vec<String>,
    /// This cell's epoch in the table (holder writes compare on it).
    epoch: u64,
    taken_over: BTreeSet<(Key, u64)>,
}

impl Rounds {
    pub fn new(
        marks: Arc<HighWaterMarks>,
        routes: RouteClient,
        config: &crate::config::CellConfig,
    ) -> Self {
        Self {
            marks,
            routes,
            cell_id: config.cell_id.clone(),
            secret: ClusterSecret::new(&config.routing.cluster_secret),
            peers: config.routing.peers(),
            timeout: Duration::from_millis(config.replication.timeout_ms.max(2000)),
            confirmed: BTreeSet::new(),
            taken_over: BTreeSet::new(),
        }
    }

    /// Runs a round every `every` (or at once when woken) while `alive`
    /// (the cell's message service) is.
    pub async fn run<T>(mut self, every: Duration, alive: std::sync::Weak<T>) {
        self.marks.start_tracking();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.marks.wake.notified() => {}
            }
            if alive.strong_count() == 0 {
                return;
            }
            if self.round().await {
                self.marks.round_done();
            }
        }
    }

    fn view(&self) -> View {
        let me = self.cell_id.as_str();
        self.routes.read(|t| View {
            standbys: t
                .standbys_for(me)
                .into_iter()
                .map(|c| (c.id.clone(), c.address.clone()))
                .collect(),
            holders: t
                .cell(me)
                .map(|c| c.mark_holders.clone())
                .unwrap_or_default(),
            epoch: t.cell(me).map_or(0, |c| c.epoch),
            taken_over: t
                .routes
                .values()
                .filter(|e| e.cell == me && e.floor_margin > 0)
                .map(|e| (e.key, e.epoch))
                .collect(),
        })
    }

    /// One round; whether every standby stored every mark taken.
    async fn round(&mut self) -> bool {
        let view = self.view();
        if !view.taken_over.is_subset(&self.taken_over) {
            // New conversations by failover: their floors go to every
            // standby before the standby is a holder again.
            self.confirmed.clear();
        }
        self.taken_over = view.taken_over.clone();
        let is_standby = |id: &String| view.standbys.iter().any(|(s, _)| s == id);
        self.confirmed.retain(is_standby);
        let kept: Vec<String> = view
            .holders
            .iter()
            .filter(|h| is_standby(h))
            .cloned()
            .collect();
        let mut epoch = view.epoch;
        if kept.len() != view.holders.len() {
            match self.set_holders(kept.clone(), epoch).await {
                Some(next) => epoch = next,
                None => return false,
            }
        }

        let marks = self.marks.take();
        let fresh: Vec<(String, String)> = view
            .standbys
            .iter()
            .filter(|(id, _)| !self.confirmed.contains(id))
            .cloned()
            .collect();
        let mut full_everywhere = None;
        if !fresh.is_empty() {
            match self.full_marks(&view).await {
                Ok(full) => {
                    let mut all = true;
                    for (id, address) in &fresh {
                        match self.push(address, &full).await {
                            Ok(()) => {
                                self.confirmed.insert(id.clone());
                            }
                            Err(e) => {
                                all = false;
                                tracing::warn!(standby = %id, error = %e, "full push of high-water marks failed");
                            }
                        }
                    }
                    if all && fresh.len() == view.standbys.len() {
                        full_everywhere = Some(full);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading the high-water marks failed"),
            }
        }
        let mut ok = view
            .standbys
            .iter()
            .all(|(id, _)| self.confirmed.contains(id));
        if ok && !marks.is_empty() {
            // Every standby at once: a round (and a move's flush waiting
            // for one) takes the slowest link, not their sum.
            let mut pushes = Vec::new();
            for (id, address) in &view.standbys {
                match self.client(address) {
                    Ok(client) => pushes.push((id, address, client)),
                    Err(e) => {
                        tracing::warn!(standby = %id, error = %e, "high-water marks not stored; retrying next round");
                        ok = false;
                    }
                }
            }
            let (this, marks) = (&*self, &marks);
            let pushed = futures::future::join_all((pushes.into_iter()).map(
                |(id, address, client)| async move {
                    (id, this.push_with(client, address, marks).await)
                },
            ))
            .await;
            for (id, result) in pushed {
                if let Err(e) = result {
                    tracing::warn!(standby = %id, error = %e, "high-water marks not stored; retrying next round");
                    ok = false;
                }
            }
        }
        if let Some(full) = &full_everywhere {
            self.marks.acknowledge(full);
        }
        if !ok {
            self.marks.restore(marks);
            return false;
        }
        self.marks.acknowledge(&marks);
        let holders: Vec<String> = self.confirmed.iter().cloned().collect();
        if holders != kept && self.set_holders(holders, epoch).await.is_none() {
            return false;
        }
        true
    }

    /// Every conversation stored here at its latest seq, and the floor of
    /// every conversation this cell took over in a failover.
    async fn full_marks(&self, view: &View) -> Result<Vec<Mark>, RoundError> {
        let store = self.marks.store()?;
        let (mut out, held) = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut after = 0;
            loop {
                let page = store.conversation_marks(after, SCAN_PAGE)?;
                let Some(&(_, last, _)) = page.last() else {
                    break;
                };
                after = last;
                out.extend(page);
            }
            let held = store.high_water_marks()?;
            Ok::<_, crate::storage::StorageError>((out, held))
        })
        .await
        .map_err(|_| RoundError::ScanFailed)??;
        let me = self.cell_id.as_str();
        self.routes.read(|t| {
            // Only what this cell builds on: a returned cell's old
            // conversations are someone else's to report.
            out.retain(|&(tenant, conversation, _)| {
                t.resolve(&Key::conversation(
                    TenantId(tenant),
                    ConversationId(conversation),
                ))
                .is_some_and(|r| r.entry.cell == me || moving_to(&r.entry.state, me))
            });
        });
        if !view.taken_over.is_empty() {
            self.routes.read(|t| {
                for (tenant, conversation, mark) in held {
                    let Some(r) = t.resolve(&Key::conversation(
                        TenantId(tenant),
                        ConversationId(conversation),
                    )) else {
                        continue;
                    };
                    if r.entry.cell == me && r.entry.floor_margin > 0 {
                        out.push((tenant, conversation, mark + r.entry.floor_margin));
                    }
                }
            });
        }
        Ok(out)
    }

    async fn push(&mut self, address: &str, marks: &[Mark]) -> Result<(), RoundError> {
        let client = self.client(address)?;
        self.push_with(client, address, marks).await
    }

    async fn push_with(
        &self,
        mut client: CellPeerClient<Channel>,
        address: &str,
        marks: &[Mark],
    ) -> Result<(), RoundError> {
        for batch in marks.chunks(PUSH_BATCH) {
            let mut call = tonic::Request::new(PbMarks {
                source_cell: self.cell_id.clone(),
                marks: batch
                    .iter()
                    .map(|&(tenant_id, conversation_id, hwm)| HighWaterMark {
                        tenant_id,
                        conversation_id,
                        hwm,
                    })
                    .collect(),
            });
            self.secret.attach(&mut call);
            call.set_timeout(self.timeout);
            client
                .store_high_water_marks(call)
                .await
                .map_err(|status| RoundError::Refused {
                    address: address.to_string(),
                    status,
                })?;
        }
        Ok(())
    }

    /// Writes this cell's holder list; the cell's new epoch, or `None` when
    /// the write failed (tried again next round).
    async fn set_holders(&self, holders: Vec<String>, epoch: u64) -> Option<u64> {
        let recorded = self
            .routes
            .set_mark_holders(&self.cell_id, holders.clone(), epoch)
            .await;
        match recorded {
            Ok(epoch) => {
                tracing::info!(?holders, "high-water mark holders recorded");
                Some(epoch)
            }
            Err(e) => {
                tracing::warn!(error = %e.message(), "recording the mark holders failed");
                None
            }
        }
    }

    fn client(&mut self, address: &str) -> Result<CellPeerClient<Channel>, RoundError> {
        Ok(self.peers.cell(address)?)
    }
}

/// Why a round did not read or ship marks.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
    #[error("the scan of the marks did not finish")]
    ScanFailed,
    #[error(transparent)]
    Dial(#[from] cellmesh_route_client::peers::DialError),
    #[error("{address}: {}", status.message())]
    Refused {
        address: String,
        status: tonic::Status,
    },
}

/// Whether a route in `state` is moving to cell `me`.
fn moving_to(state: &RouteState, me: &str) -> bool {
    matches!(state, RouteState::Migrating { to, .. } | RouteState::Frozen { to } if to == me)
}
