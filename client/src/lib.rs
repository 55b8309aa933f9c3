//! The command-line clients of a deployment: `connect` (channels, bearer
//! tokens, errors a person can read), `chat` (a user's client of the edge:
//! conversations, sends, history, a live tail, files), `files` (uploads
//! and downloads through signed URLs) and `ctl` (the operator's
//! client of the route table and the control plane's operations API, with
//! `ctl status`). The `cellmesh` binary only parses their flags.

pub mod chat;
pub mod connect;
pub mod ctl;
pub mod files;
pub mod plan;
