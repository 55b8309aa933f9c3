//! Conversations this cell owns through a failover but holds no record of.
//! A standby promoted before a conversation's meta reached it (its history
//! may be here, its record is not) must never answer "not found" for a
//! conversation the route table gives it: it answers `RETRY_LATER` /
//! `CONVERSATION_INCOMPLETE` and fetches the record, members and read
//! positions from the cell it took the conversation over from, once that
//! cell answers. Only when the failed cell says it never had the
//! conversation is the id answered as unknown.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::ExportRequest;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::MessageService;
use crate::config::CellConfig;
use crate::error::CellError;
use crate::storage::{Mutation, Store};

/// How long the failed cell's "never had it" is believed.
const ABSENT_FOR: Duration = Duration::from_secs(10);
/// Conversations remembered as absent before the list starts again.
const MAX_ABSENT: usize = 100_000;
/// How long a client waits before asking again.
const RETRY_AFTER: Duration = Duration::from_millis(500);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Fetches in flight, and conversations the failed cells said they never
/// had, by (tenant, conversation): another tenant's caller naming the same
/// id must not change what this tenant is answered.
#[derive(Default)]
pub(super) struct Repairs {
    inner: Mutex<RepairState>,
}

#[derive(Default)]
struct RepairState {
    fetching: HashSet<(TenantId, ConversationId)>,
    absent: HashMap<(TenantId, ConversationId), Instant>,
}

/// What the failed cell answered.
enum Fetched {
    Stored,
    Absent,
}

impl MessageService {
    /// For a conversation of `tenant` not stored here: the error to answer
    /// instead of "not found" while the route table gives it to this cell
    /// through a failover whose source may still hold it (a fetch of its
    /// meta starts in the background); `None` when "not found" is right.
    pub(super) fn incomplete(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Option<CellError> {
        let from = self.ownership.taken_over_from(tenant, conversation)?;
        let key = (tenant, conversation);
        {
            let mut state = self.repairs.inner.lock().expect("repairs");
            if let Some(at) = state.absent.get(&key) {
                if at.elapsed() < ABSENT_FOR {
                    return None;
                }
                state.absent.remove(&key);
            }
            if state.fetching.insert(key) {
                let (store, config) = (self.store.clone(), self.config.clone());
                let repairs = self.repairs.clone();
                tokio::spawn(async move {
                    let fetched = fetch(&store, &config, &from, tenant, conversation).await;
                    let mut state = repairs.inner.lock().expect("repairs");
                    state.fetching.remove(&key);
                    match fetched {
                        Ok(Fetched::Stored) => {
                            tracing::info!(%conversation, %from, "fetched the meta of a conversation taken over without it");
                        }
                        Ok(Fetched::Absent) => {
                            if state.absent.len() > MAX_ABSENT {
                                state.absent.clear();
                            }
                            state.absent.insert(key, Instant::now());
                        }
                        Err(e) => {
                            tracing::warn!(%conversation, %from, error = %e, "cannot fetch the meta of a conversation taken over without it");
                        }
                    }
                });
            }
        }
        Some(CellError::RetryLater {
            reason: Reason::ConversationIncomplete,
            message: format!(
                "conversation {conversation} was failed over here before its record arrived; \
                 it is being fetched from the cell it came from"
            ),
            retry_after: RETRY_AFTER,
        })
    }
}

/// Asks the cell at `from` for the conversation's record, members and read
/// positions, and stores them if the record is still missing here.
async fn fetch(
    store: &Store,
    config: &CellConfig,
    from: &str,
    tenant: TenantId,
    conversation: ConversationId,
) -> Result<Fetched, FetchError> {
    let mut client = config.routing.peers().cell(from)?;
    // No messages: the record, members and read positions only.
    let mut request = tonic::Request::new(ExportRequest {
        tenant_id: tenant.get(),
        conversation_id: conversation.get(),
        after_seq: u64::MAX - 1,
        limit: 1,
    });
    ClusterSecret::new(&config.routing.cluster_secret).attach(&mut request);
    request.set_timeout(FETCH_TIMEOUT);
    let chunk = match client.export_conversation(request).await {
        Ok(chunk) => chunk.into_inner(),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::NotFound | tonic::Code::PermissionDenied
            ) =>
        {
            return Ok(Fetched::Absent);
        }
        Err(s) => return Err(FetchError::Refused(s)),
    };
    let Some(record) = chunk.conversation.filter(|r| r.tenant_id == tenant.get()) else {
        return Ok(Fetched::Absent);
    };
    if store.conversation(conversation)?.is_some() {
        return Ok(Fetched::Stored);
    }
    let mut m = Mutation::new();
    (store).stage_meta(&mut m, conversation, &record, &UserId::many(&chunk.members))?;
    for p in &chunk.read_positions {
        m.raise_read_seq(conversation, UserId(p.user_id), p.read_seq);
    }
    let mut seq = store.conv_seq(conversation)?;
    crate::convert::merge_jumps(&mut seq.jumps, &chunk.seq_jumps);
    m.put_conv_seq(conversation, &seq);
    store.commit(m).await?;
    Ok(Fetched::Stored)
}

/// Why a conversation's record could not be fetched from the cell that
/// held it.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error(transparent)]
    Dial(#[from] cellmesh_route_client::peers::DialError),
    #[error("{}", .0.message())]
    Refused(tonic::Status),
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

impl Repairs {
    pub(super) fn new() -> Arc<Self> {
        Arc::default()
    }
}
