//! The cell's gRPC surface: thin handlers over the domain services.

mod messaging;
mod sync;

pub use messaging::MessagingApi;
pub use sync::SyncApi;
