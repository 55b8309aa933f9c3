//! The sending end of one `CellPeer.DeliverStream`: batches go out as they
//! are submitted, without waiting for the answer to the one before, and
//! their answers come back in order. Once anything fails (the call, a
//! batch, an answer later than its deadline) the stream is broken for
//! good: every batch submitted afterwards fails without being sent, so no
//! batch overtakes one that did not arrive. The forwarder replaces a broken
//! stream only once it has taken every answer of the old one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{DeliverBatchRequest, DeliverBatchResponse};
use cellmesh_telemetry::trace::grpc::Channel;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// What became of one batch: its answer, or why the stream broke.
pub type Outcome = Result<DeliverBatchResponse, Undelivered>;

/// Why a batch was not delivered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Undelivered {
    /// The receiving cell refused the call (or the stream) with this status.
    #[error("{0}")]
    Refused(tonic::Status),
    #[error("timed out")]
    TimedOut,
    #[error("the receiving cell ended the stream")]
    Ended,
    #[error("an answer to no batch")]
    Unexpected,
    #[error("the delivery stream is closed")]
    Closed,
    /// Delivered to this cell's own processor, which failed.
    #[error("delivering here: {0}")]
    Local(std::sync::Arc<super::PipelineError>),
    /// The task carrying the call panicked or was cancelled.
    #[error("the delivery task failed")]
    TaskFailed,
}

struct Waiting {
    deadline: Instant,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct State {
    /// Batches sent and not yet answered, oldest first.
    waiting: VecDeque<Waiting>,
    /// Why the stream broke, once it has.
    broken: Option<Undelivered>,
    /// The receiving cell does not serve streams (an earlier release).
    unimplemented: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the reader to take a new batch's deadline into account.
    submitted: Notify,
}

pub struct DeliverStream {
    requests: mpsc::UnboundedSender<DeliverBatchRequest>,
    shared: Arc<Shared>,
    timeout: Duration,
    task: tokio::task::JoinHandle<()>,
}

impl DeliverStream {
    /// Opens a stream on `client`; each batch must be answered within
    /// `timeout` of its submission.
    pub fn open(
        mut client: CellPeerClient<Channel>,
        secret: &ClusterSecret,
        timeout: Duration,
    ) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            submitted: Notify::new(),
        });
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        secret.attach(&mut request);
        let answers = shared.clone();
        let task = tokio::spawn(async move {
            let why = match client.deliver_stream(request).await {
                Ok(response) => read_answers(response.into_inner(), &answers).await,
                Err(status) => {
                    if status.code() == tonic::Code::Unimplemented {
                        answers.state.lock().expect("stream state").unimplemented = true;
                    }
                    Undelivered::Refused(status)
                }
            };
            break_with(&answers.state, why);
        });
        Self {
            requests,
            shared,
            timeout,
            task,
        }
    }

    /// Sends `batch` after those submitted before it; the receiver gets its
    /// answer, or the reason the stream broke.
    pub fn submit(&self, batch: DeliverBatchRequest) -> oneshot::Receiver<Outcome> {
        let (reply, rx) = oneshot::channel();
        let mut state = self.shared.state.lock().expect("stream state");
        if let Some(why) = &state.broken {
            let _ = reply.send(Err(why.clone()));
            return rx;
        }
        if self.requests.send(batch).is_err() {
            let _ = reply.send(Err(Undelivered::Closed));
            return rx;
        }
        state.waiting.push_back(Waiting {
            deadline: Instant::now() + self.timeout,
            reply,
        });
        self.shared.submitted.notify_one();
        rx
    }

    pub fn is_broken(&self) -> bool {
        self.shared
            .state
            .lock()
            .expect("stream state")
            .broken
            .is_some()
    }

    /// Whether the receiving cell answered that it has no such call.
    pub fn unimplemented(&self) -> bool {
        self.shared
            .state
            .lock()
            .expect("stream state")
            .unimplemented
    }
}

impl Drop for DeliverStream {
    fn drop(&mut self) {
        self.task.abort();
        break_with(&self.shared.state, Undelivered::Closed);
    }
}

/// Hands each answer to the oldest batch waiting; returns why the stream
/// ended.
async fn read_answers(
    mut answers: tonic::Streaming<DeliverBatchResponse>,
    shared: &Shared,
) -> Undelivered {
    let state = &shared.state;
    loop {
        let deadline = state
            .lock()
            .expect("stream state")
            .waiting
            .front()
            .map(|w| w.deadline);
        // `message` keeps what it has read when the wait is cut short.
        let next = tokio::select! {
            next = answers.message() => next,
            _ = shared.submitted.notified(), if deadline.is_none() => continue,
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                return Undelivered::TimedOut;
            }
        };
        let answer = match next {
            Ok(Some(answer)) => answer,
            Ok(None) => return Undelivered::Ended,
            Err(status) => return Undelivered::Refused(status),
        };
        let Some(waiting) = state.lock().expect("stream state").waiting.pop_front() else {
            return Undelivered::Unexpected;
        };
        let _ = waiting.reply.send(Ok(answer));
    }
}

/// Marks the stream broken and fails every batch still waiting.
fn break_with(state: &Mutex<State>, why: Undelivered) {
    let mut state = state.lock().expect("stream state");
    if state.broken.is_none() {
        state.broken = Some(why.clone());
    }
    for waiting in state.waiting.drain(..) {
        let _ = waiting.reply.send(Err(why.clone()));
    }
}
