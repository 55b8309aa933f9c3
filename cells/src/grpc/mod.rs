//! The cell's gRPC surface: thin handlers over the domain services.

mod messaging;
mod peer;
mod segments;
mod sync;

pub use messaging::MessagingApi;
pub use peer::PeerApi;
pub use sync::SyncApi;
