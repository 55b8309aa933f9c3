//! Failover holds: the word of an operator (or of the upgrade tooling) that
//! a cell is being restarted on purpose. Until a hold ends, the probe loop
//! neither fences nor fails over the held cell for failed probes, so a
//! planned restart that outlasts the detector and the owner lease does not
//! move the cell's routes; one still failing when its hold ends (or is
//! released) is fenced and failed over as any other. Holds are records in
//! the coordination store (`cellmesh/holds/<cell>`), so whichever replica
//! is active honours them; an expired one is deleted by whoever reads it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_coord::{CoordError, Coordination, HOLDS_PREFIX};
use serde::{Deserialize, Serialize};

/// The longest hold: a restart that takes longer is an outage, and is
/// failed over.
pub const MAX_HOLD: Duration = Duration::from_secs(3600);

/// One cell's hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub cell: String,
    /// When it ends: Unix ms on the clock of the replica that recorded it.
    pub until_ms: u64,
    /// Why (shown to operators).
    #[serde(default)]
    pub reason: String,
}

impl Hold {
    pub fn to_pb(&self) -> cellmesh_proto::v1::FailoverHold {
        cellmesh_proto::v1::FailoverHold {
            cell_id: self.cell.clone(),
            until_ms: self.until_ms,
            reason: self.reason.clone(),
        }
    }
}

/// The holds in a coordination store.
#[derive(Clone)]
pub struct Holds {
    coordination: Arc<dyn Coordination>,
}

fn key(cell: &str) -> String {
    format!("{HOLDS_PREFIX}{cell}")
}

impl Holds {
    pub fn new(coordination: Arc<dyn Coordination>) -> Self {
        Self { coordination }
    }

    /// Holds `cell` for `length` from `now_ms`, replacing the hold it had;
    /// a zero `length` releases it.
    pub async fn set(
        &self,
        cell: &str,
        length: Duration,
        reason: &str,
        now_ms: u64,
    ) -> Result<(), CoordError> {
        if length.is_zero() {
            return self.release(cell).await;
        }
        let hold = Hold {
            cell: cell.to_string(),
            until_ms: now_ms + length.as_millis() as u64,
            reason: reason.to_string(),
        };
        let value = serde_json::to_string(&hold).expect("a hold encodes");
        self.coordination.put(&key(cell), &value).await
    }

    /// Deletes `cell`'s hold, whatever it says (one written meanwhile is
    /// deleted too).
    async fn release(&self, cell: &str) -> Result<(), CoordError> {
        let key = key(cell);
        loop {
            let records = self.coordination.records(&key).await?;
            let Some(value) = records.get(&key) else {
                return Ok(());
            };
            if self.coordination.compare_and_delete(&key, value).await? {
                return Ok(());
            }
        }
    }

    /// The holds that have not ended at `now_ms`, by cell. Expired records
    /// are deleted; one this release cannot read is left alone (and holds
    /// nothing).
    pub async fn live(&self, now_ms: u64) -> Result<BTreeMap<String, Hold>, CoordError> {
        let mut live = BTreeMap::new();
        for (key, value) in self.coordination.records(HOLDS_PREFIX).await? {
            match serde_json::from_str::<Hold>(&value) {
                Ok(hold) if hold.until_ms > now_ms => {
                    live.insert(hold.cell.clone(), hold);
                }
                Ok(_) => {
                    self.coordination.compare_and_delete(&key, &value).await?;
                }
                Err(e) => tracing::warn!(%key, error = %e, "unreadable failover hold ignored"),
            }
        }
        Ok(live)
    }
}

/// Asks the first control-plane replica of `admin` that answers to hold
/// `cell`'s failover for `length` (zero: release it); every live hold.
pub async fn request(
    admin: &[String],
    secret: &cellmesh_proto::secret::ClusterSecret,
    cell: &str,
    length: Duration,
    reason: &str,
) -> Result<Vec<cellmesh_proto::v1::FailoverHold>, tonic::Status> {
    use cellmesh_proto::tls::Dial;
    use cellmesh_proto::v1::operations_client::OperationsClient;
    let mut last = tonic::Status::unavailable("no control-plane admin endpoint given");
    for endpoint in admin {
        let dialed = match cellmesh_proto::tls::endpoint(endpoint.clone()) {
            Ok(e) => e.dial().await,
            Err(e) => Err(e),
        };
        let channel = match dialed {
            Ok(channel) => channel,
            Err(e) => {
                last = tonic::Status::unavailable(format!("{endpoint}: {e}"));
                continue;
            }
        };
        let mut ask = tonic::Request::new(cellmesh_proto::v1::HoldFailoverRequest {
            cell_id: cell.to_string(),
            seconds: length.as_secs().try_into().unwrap_or(u32::MAX),
            reason: reason.to_string(),
        });
        secret.attach(&mut ask);
        let holds = OperationsClient::new(channel).hold_failover(ask).await?;
        return Ok(holds.into_inner().holds);
    }
    Err(last)
}

/// The holds as the probe loop knows them: read again at each probe round
/// (the last read stands while the store does not answer), each judged
/// against the clock when asked.
pub struct Watched {
    holds: Holds,
    known: BTreeMap<String, Hold>,
    /// Cells whose hold was said to keep them (once per hold).
    told: std::collections::BTreeSet<String>,
}

impl Watched {
    pub fn new(holds: Holds) -> Self {
        Self {
            holds,
            known: BTreeMap::new(),
            told: Default::default(),
        }
    }

    pub async fn refresh(&mut self) {
        match self.holds.live(crate::operations::now_ms()).await {
            Ok(live) => {
                crate::metrics::holds(live.len());
                self.known = live;
            }
            Err(e) => tracing::warn!(error = %e, "failover holds not read; the last read stands"),
        }
    }

    /// Whether `cell` is held now.
    pub fn holds(&self, cell: &str) -> bool {
        let now = crate::operations::now_ms();
        self.known.get(cell).is_some_and(|h| h.until_ms > now)
    }

    /// Whether a hold keeps `cell` as it is now; says so once per hold when
    /// `acting` (the loop would fence it or fail it over without the hold).
    pub fn keeps(&mut self, cell: &str, acting: bool) -> bool {
        let now = crate::operations::now_ms();
        let Some(hold) = self.known.get(cell).filter(|h| h.until_ms > now) else {
            self.told.remove(cell);
            return false;
        };
        if acting && self.told.insert(cell.to_string()) {
            tracing::warn!(
                cell,
                ends_in_ms = hold.until_ms - now,
                reason = %hold.reason,
                "failing under a failover hold: neither fenced nor failed over until it ends"
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_coord::embedded::EmbeddedCoordination;

    #[tokio::test]
    async fn a_hold_lives_until_its_deadline_or_its_release() {
        let coordination: Arc<dyn Coordination> = Arc::new(EmbeddedCoordination::default());
        let holds = Holds::new(coordination.clone());
        let minute = Duration::from_secs(60);
        holds
            .set("eu-west/c1", minute, "upgrade", 1_000)
            .await
            .unwrap();
        holds.set("eu-west/c10", minute, "", 1_000).await.unwrap();
        let live = holds.live(60_999).await.unwrap();
        assert_eq!(live.len(), 2);
        assert_eq!(live["eu-west/c1"].until_ms, 61_000);
        assert_eq!(live["eu-west/c1"].reason, "upgrade");
        // Released by name: the cell whose id extends it keeps its hold.
        holds
            .set("eu-west/c1", Duration::ZERO, "", 2_000)
            .await
            .unwrap();
        let live = holds.live(2_000).await.unwrap();
        assert_eq!(live.keys().collect::<Vec<_>>(), ["eu-west/c10"]);
        // Past its deadline it holds nothing, and its record is gone.
        assert!(holds.live(61_000).await.unwrap().is_empty());
        assert!(coordination.records(HOLDS_PREFIX).await.unwrap().is_empty());
        // Releasing what is not held is no error.
        holds
            .set("us-east/c1", Duration::ZERO, "", 0)
            .await
            .unwrap();
    }
}
