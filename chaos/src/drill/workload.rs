//! The drill's workload: senders writing through the edge with unique
//! request ids, recording each operation's invocation and outcome, and the
//! read-back of every conversation once the deployment has settled.

use cellmesh_proto::tls::Dial;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::history::{History, Outcome, SendOp, Skipped, Stored};
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, Direction, ErrorCode, ExportRequest, MessageType,
    PullRequest, SendRequest,
};
use tonic::transport::Channel;

use super::files::{self, DrillFiles};
use crate::target::DevTarget;
use cellmesh_proto::reason::Reason;

/// Drill users start here (clear of the demo users and the benches').
const USER_BASE: u64 = 300_000;
/// How long the read-back waits for a failed cell's history to be backfilled
/// (it comes back, is marked up, then copied into the current owner).
const BACKFILL_WAIT: Duration = Duration::from_secs(30);

/// How long a re-send after a fault keeps trying for a definite answer.
const RESEND_FOR: Duration = Duration::from_secs(20);

/// One send of the message tagged `tag` (its request id and body) by
/// `user` of `tenant` into `conversation`, backing off as a client does
/// when told to slow down or to come back later.
async fn send_tagged(
    dev: &DevTarget,
    client: &mut MessagingClient<Channel>,
    (tenant, user, conversation): (u64, u64, u64),
    (tag, with_file): (&str, bool),
    (files, unknown): (&DrillFiles, &UnknownReasons),
) -> Outcome {
    let file = match with_file {
        true => files.for_send(dev, (conversation, user), tag).await,
        false => None,
    };
    let message = SendRequest {
        conversation_id: conversation,
        client_req_id: tag.to_string(),
        r#type: MessageType::Text as i32,
        body: tag.as_bytes().to_vec(),
        attachment_ids: file.into_iter().collect(),
        ..Default::default()
    };
    let mut request = dev.request_in(tenant, message, user, "tool");
    request.set_timeout(Duration::from_secs(10));
    let answer = client.send(request).await;
    let outcome = Outcome::of_send(answer.as_ref().map(|r| r.get_ref()));
    let Err(e) = answer else {
        return outcome;
    };
    let d = cellmesh_proto::status::error_detail(&e);
    if let (Some(file), true) = (file, d.reason == Reason::AttachmentNotFound.as_str()) {
        files.not_found((conversation, user), file, tag);
    }
    let code = ErrorCode::try_from(d.code).unwrap_or(ErrorCode::Internal);
    match code {
        ErrorCode::RateLimited => tokio::time::sleep(Duration::from_millis(20)).await,
        ErrorCode::RetryLater => tokio::time::sleep(Duration::from_millis(50)).await,
        _ => {}
    }
    let kind = match outcome {
        Outcome::Unknown => "unknown",
        _ => "rejected",
    };
    let reason = format!("{kind} {}/{}", code.short_name(), d.reason);
    *unknown.lock().expect("reasons").entry(reason).or_default() += 1;
    outcome
}

pub fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// A message as the checker sees it: its body is the tag of the send that
/// wrote it; a tombstone (a reconciled duplicate) has none.
fn stored_as_read(seq: u64, msg_id: u64, state: i32, body: &[u8]) -> Stored {
    Stored {
        seq,
        msg_id,
        tag: if state == cellmesh_proto::v1::MessageState::Recalled as i32 {
            format!("tombstone-{seq}")
        } else {
            String::from_utf8_lossy(body).into_owned()
        },
    }
}

/// How often each `CODE/REASON` left a send's outcome unknown or
/// rejected it (keys `unknown CODE/REASON`, `rejected CODE/REASON`).
pub type UnknownReasons = Arc<Mutex<std::collections::BTreeMap<String, u64>>>;

pub struct Workload {
    pub dev: Arc<DevTarget>,
    /// The tenant the workload's users and conversations belong to.
    pub tenant: u64,
    /// The edges the senders use, round-robin; the first reads back.
    pub channels: Vec<Channel>,
    pub senders: Vec<u64>,
    pub conversations: Vec<u64>,
    /// Why sends were rejected or their outcomes unknown (retry-later
    /// reasons, timeouts).
    pub unknown: UnknownReasons,
    /// The files sends name.
    pub files: Arc<DrillFiles>,
    run_id: u128,
}

impl Workload {
    /// Byte strings only this run's sends and conversations carry: the
    /// prefix of every message body (its tag) and of every title.
    pub fn tags(&self) -> Vec<String> {
        vec![
            format!("d{}-{}-", self.run_id, self.tenant),
            format!("drill {} ", self.run_id),
        ]
    }

    /// Group conversations among the drill's senders, in `tenant`. The
    /// senders' user ids are the same in every tenant.
    pub async fn create(
        dev: Arc<DevTarget>,
        tenant: u64,
        senders: u64,
        conversations: u64,
    ) -> anyhow::Result<Self> {
        let run_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let channel = Channel::from_shared(dev.edge.clone())?.connect().await?;
        let senders: Vec<u64> = (0..senders).map(|i| USER_BASE + i).collect();
        let mut ids = Vec::new();
        for i in 0..conversations {
            let mut client = MessagingClient::new(channel.clone());
            let created = client
                .create_conversation(dev.request_in(
                    tenant,
                    CreateConversationRequest {
                        kind: ConversationKind::Group as i32,
                        title: format!("drill {run_id} {i}"),
                        member_ids: senders[1..].to_vec(),
                        client_req_id: format!("drill-{run_id}-{i}"),
                        ..Default::default()
                    },
                    senders[0],
                    "tool",
                ))
                .await
                .map_err(|e| anyhow::anyhow!(cellmesh_proto::status::describe(&e)))?;
            ids.push(
                created
                    .into_inner()
                    .conversation
                    .map_or(0, |c| c.conversation_id),
            );
        }
        Ok(Self {
            unknown: UnknownReasons::default(),
            files: Arc::new(DrillFiles::new(tenant, run_id, channel.clone())),
            dev,
            tenant,
            channels: vec![channel],
            senders,
            conversations: ids,
            run_id,
        })
    }

    /// Senders alternate between the edges added so far and `url`.
    pub async fn add_edge(&mut self, url: &str) -> anyhow::Result<()> {
        self.channels
            .push(Channel::from_shared(url.to_string())?.connect().await?);
        Ok(())
    }

    /// One task per sender, writing round-robin into the conversations
    /// until `stop`.
    pub fn start(
        &self,
        epoch: Instant,
        stop: Instant,
        ops: Arc<Mutex<Vec<SendOp>>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut workers = Vec::new();
        for (w, &user) in self.senders.iter().enumerate() {
            let (dev, ops, convs, channel) = (
                self.dev.clone(),
                ops.clone(),
                self.conversations.clone(),
                self.channels[w % self.channels.len()].clone(),
            );
            let (run_id, tenant) = (self.run_id, self.tenant);
            let (unknown, files) = (self.unknown.clone(), self.files.clone());
            workers.push(tokio::spawn(async move {
                let mut client = MessagingClient::new(channel);
                let mut n = 0u64;
                while Instant::now() < stop {
                    n += 1;
                    let conversation = convs[(n as usize + w) % convs.len()];
                    let tag = format!("d{run_id}-{tenant}-{user}-{n}");
                    let invoked_ms = now_ms(epoch);
                    let to = (tenant, user, conversation);
                    let what = (tag.as_str(), n.is_multiple_of(files::EVERY));
                    let outcome =
                        send_tagged(&dev, &mut client, to, what, (&files, &unknown)).await;
                    ops.lock().expect("ops").push(SendOp {
                        conversation,
                        sender: user,
                        client_req_id: tag,
                        invoked_ms,
                        completed_ms: now_ms(epoch),
                        outcome,
                    });
                }
            }));
        }
        workers
    }

    /// A task that sends `op` again — same request id, same body — as a
    /// client that lost its answer does after a fault, retrying answers
    /// that leave the outcome unknown for up to [`RESEND_FOR`]; it yields
    /// what came back.
    /// Why the sends of `loads` were refused or their outcomes unknown,
    /// counted by reason over them all.
    pub fn unknown_reasons(loads: &[&Workload]) -> std::collections::BTreeMap<String, u64> {
        let mut by_reason = std::collections::BTreeMap::new();
        for load in loads {
            for (reason, n) in load.unknown.lock().expect("reasons").iter() {
                *by_reason.entry(reason.clone()).or_default() += n;
            }
        }
        by_reason
    }

    pub fn resend(&self, op: SendOp) -> tokio::task::JoinHandle<(SendOp, Outcome)> {
        let (dev, tenant, unknown) = (self.dev.clone(), self.tenant, self.unknown.clone());
        let files = self.files.clone();
        let mut client = MessagingClient::new(self.channels[0].clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + RESEND_FOR;
            // The same request: with its file if it named one.
            let with_file = files.named(&op.client_req_id);
            loop {
                let to = (tenant, op.sender, op.conversation);
                let what = (op.client_req_id.as_str(), with_file);
                let outcome = send_tagged(&dev, &mut client, to, what, (&files, &unknown)).await;
                if outcome != Outcome::Unknown || Instant::now() >= deadline {
                    return (op, outcome);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    /// The copy of `conversation` that `cell` kept after moving it away,
    /// read through the cell-to-cell export.
    pub async fn source_copy(&self, cell: &str, conversation: u64) -> anyhow::Result<Vec<Stored>> {
        let routes = self.dev.routes().await?;
        let address = routes
            .read(|t| t.cell(cell).map(|c| c.address.clone()))
            .ok_or_else(|| anyhow::anyhow!("unknown cell {cell}"))?;
        let channel = cellmesh_proto::tls::endpoint(address)?.dial().await?;
        let mut peer = CellPeerClient::new(channel).max_decoding_message_size(64 << 20);
        let secret = self.dev.secret();
        let mut stored = Vec::new();
        let mut after = 0;
        loop {
            let mut request = tonic::Request::new(ExportRequest {
                tenant_id: self.tenant,
                conversation_id: conversation,
                after_seq: after,
                limit: 1_000,
            });
            secret.attach(&mut request);
            let chunk = peer
                .export_conversation(request)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "exporting {conversation} from {cell}: {}",
                        cellmesh_proto::status::describe(&e)
                    )
                })?
                .into_inner();
            let Some(last) = chunk.messages.last().map(|m| m.seq) else {
                return Ok(stored);
            };
            stored.extend(chunk.messages.into_iter().filter_map(|m| {
                let r = m.record?;
                Some(stored_as_read(m.seq, r.msg_id, r.state, &r.body))
            }));
            after = last;
        }
    }

    /// Every conversation as stored, with its failover floors. History
    /// below a floor that the owner still reports unavailable (a failed
    /// cell's part, not yet backfilled) is waited for, up to
    /// [`BACKFILL_WAIT`]; what is still missing after that counts as lost.
    pub async fn read_back(&self, history: &mut History) -> anyhow::Result<()> {
        self.read_back_waiting(history, BACKFILL_WAIT).await
    }

    /// [`Self::read_back`], waiting up to `wait` for unavailable history.
    pub async fn read_back_waiting(
        &self,
        history: &mut History,
        wait: Duration,
    ) -> anyhow::Result<()> {
        history.files_sent.extend(self.files.sent());
        let deadline = tokio::time::Instant::now() + wait;
        for &conversation in &self.conversations {
            history.tenants.insert(conversation, self.tenant);
            let read = loop {
                let read = self.read_conversation(conversation).await?;
                if read.unavailable == 0 || tokio::time::Instant::now() >= deadline {
                    if read.unavailable > 0 {
                        println!(
                            "  conversation {conversation}: history through seq {} still unavailable",
                            read.unavailable
                        );
                    }
                    break read;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            history.conversations.insert(conversation, read.stored);
            history.files_read.extend(read.files);
            // The owners' own account of every floor jump.
            for (first, last) in read.skipped {
                let skipped = Skipped {
                    conversation,
                    first,
                    last,
                };
                if !history.skipped.contains(&skipped) {
                    history.skipped.push(skipped);
                }
            }
        }
        Ok(())
    }

    /// One conversation's history through the edge: messages, the ranges
    /// its owners skipped, and how far history is still unavailable.
    async fn read_conversation(&self, conversation: u64) -> anyhow::Result<ReadBack> {
        let mut client = MessagingClient::new(self.channels[0].clone());
        let mut read = ReadBack::default();
        let mut since = 0;
        loop {
            let page = client
                .pull(self.dev.request_in(
                    self.tenant,
                    PullRequest {
                        conversation_id: conversation,
                        since_seq: since,
                        direction: Direction::Forward as i32,
                        limit: 500,
                        ..Default::default()
                    },
                    self.senders[0],
                    "tool",
                ))
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "reading back {conversation}: {}",
                        cellmesh_proto::status::describe(&e)
                    )
                })?
                .into_inner();
            read.unavailable = read.unavailable.max(page.unavailable_through);
            read.skipped
                .extend(page.skipped.iter().map(|s| (s.first, s.last)));
            read.stored.extend(
                page.messages
                    .iter()
                    .map(|m| stored_as_read(m.seq, m.msg_id, m.state, &m.body)),
            );
            for m in page.messages.iter().filter(|m| !m.attachments.is_empty()) {
                let tag = String::from_utf8_lossy(&m.body);
                let at = (conversation, m.seq, tag.as_ref());
                let reader = self.senders[0];
                (read.files).extend(self.files.read(&self.dev, at, &m.attachments, reader).await);
            }
            if !page.has_more || page.next_seq <= since {
                return Ok(read);
            }
            since = page.next_seq;
        }
    }
}

/// A conversation as read back through `Pull`.
#[derive(Default)]
struct ReadBack {
    stored: Vec<Stored>,
    /// Skipped ranges (first, last) the pages reported.
    skipped: Vec<(u64, u64)>,
    /// History at or below this seq is still unavailable (0: none).
    unavailable: u64,
    /// The files of the messages read, as downloaded.
    files: Vec<crate::history::FileRead>,
}
