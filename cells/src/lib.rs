//! A cellmesh cell: a self-contained unit that runs the whole message
//! pipeline for the conversations and users routed to it (DESIGN.md §4).
//!
//! - [`message`]: the message service — send, history, conversations, read
//!   state — as domain logic over [`storage`].
//! - [`storage`]: RocksDB, group commit and key encodings; the only module
//!   that names the storage engine.
//! - [`pipeline`] and [`queue`]: after the ack, the event queue (the outbox
//!   read in place, or Kafka through the outbox relay), the fan-out
//!   processor, and the forwarders' ordered delivery streams to other cells.
//! - [`sync`]: per-user sync queues pushed to devices, conversation lists,
//!   presence and typing.
//! - [`grpc`] and [`convert`]: the wire surface, thin over the domain.
//! - [`migration`]: the cell's half of moves — exports, the tenant seal, the
//!   copy loops on the target and the cold segments they fetch.
//! - [`replication`]: replication mode `sync`, writes stored on the
//!   standbys before the ack.
//! - [`cold`]: the cold tier, older history as segments in object
//!   storage; the tierer that moves it there is `message::tier`.
//! - [`hwm`]: failover high-water marks, pushed to the standbys in rounds
//!   and fenced on.
//! - [`user`]: [`UserKey`], the tenant-scoped user every per-user record
//!   and map is keyed by.
//! - [`search`]: full-text search, a tantivy index per tenant fed after the
//!   ack by its own queue consumer; `message::search` answers queries.
//! - [`server`]: starting and stopping a cell; [`config`]: its TOML config.

pub mod attachments;
pub mod backup;
pub mod clock;
pub mod cold;
pub mod config;
pub mod convert;
pub mod error;
pub mod failpoints;
pub mod grpc;
pub mod homes;
pub mod hwm;
pub mod ids;
pub mod message;
pub mod metrics;
pub mod migration;
pub mod ownership;
pub mod pipeline;
pub mod priority;
pub mod queue;
pub mod ratelimit;
pub mod replication;
pub mod routed;
pub mod search;
pub mod server;
pub mod storage;
pub mod sync;
pub mod takeover;
pub mod user;

pub use config::CellConfig;
pub use error::CellError;
pub use server::{Placement, RunningCell, StartError, run, start, start_placed};
pub use user::UserKey;
