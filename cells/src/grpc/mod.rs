//! The cell's gRPC surface: thin handlers over the domain services.

mod attachments;
mod backups;
mod deliver;
mod messaging;
mod peer;

mod sync;

use std::sync::Arc;

use tonic::{Response, Status};
use tracing::Instrument;

pub use attachments::AttachmentsApi;
pub use backups::BackupsApi;
pub use messaging::MessagingApi;
pub use peer::PeerApi;
pub use sync::SyncApi;

use crate::error::CellError;
use crate::message::MessageService;

type Reply<T> = Result<Response<T>, Status>;

/// Runs a write to its end even if the caller goes away (a timeout, an
/// edge's attempt deadline): once its batch is submitted, a retry must
/// find its stored answer, never an abandoned attempt whose effect lands
/// anyway after the retry made a second one. Its spans stay in the
/// call's trace.
async fn to_end<T, F>(
    service: &Arc<MessageService>,
    write: impl FnOnce(Arc<MessageService>) -> F,
) -> Result<T, Status>
where
    F: Future<Output = Result<T, CellError>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(write(service.clone()).instrument(tracing::Span::current()))
        .await
        .map_err(|e| Status::internal(format!("write task: {e}")))?
        .map_err(Status::from)
}
