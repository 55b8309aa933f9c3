//! The cell's gRPC surface: thin handlers over the domain services.

mod messaging;

pub use messaging::MessagingApi;
