//! What a drill records. Clients log each send's invocation and outcome,
//! devices log every delivery and every cursor the server confirmed, cells
//! log the writes they accepted (with the route epoch), and after the drill
//! every conversation's history is read back. Messages are identified by a
//! tag the workload puts in the body: the send's `client_req_id`.

use std::collections::BTreeMap;

use cellmesh_proto::status::error_code;
use cellmesh_proto::v1::{ErrorCode, SendResponse};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub sends: Vec<SendOp>,
    /// Final read-back: conversation → messages in history order.
    pub conversations: BTreeMap<u64, Vec<Stored>>,
    pub deliveries: Vec<DeliveryRecord>,
    pub cursor_acks: Vec<CursorAck>,
    /// Seq floors set by failovers: places seq may jump.
    pub floors: Vec<Floor>,
    /// Seq ranges owners skipped on purpose, as `Pull` reports them (floor
    /// jumps, recorded by the owner that first assigned above each floor):
    /// the other places seq may jump.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Writes cells report accepting.
    pub accepted: Vec<AcceptedWrite>,
    pub migrations: Vec<Migration>,
    /// The devices the drill ran, each with what must reach it.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// The tenant of each conversation the drill wrote to (tenants share
    /// cells and user ids; a device must only ever see its own tenant's).
    #[serde(default)]
    pub tenants: BTreeMap<u64, u64>,
    /// Acknowledged requests sent again after a fault.
    #[serde(default)]
    pub resends: Vec<Resend>,
    /// Sends that named a file, and every stored message's files as
    /// downloaded after the drill.
    #[serde(default)]
    pub files_sent: Vec<FileSend>,
    #[serde(default)]
    pub files_read: Vec<FileRead>,
}

/// A send that named an uploaded file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSend {
    pub conversation: u64,
    pub client_req_id: String,
    pub attachment_id: u64,
    /// The SHA-256 of the bytes uploaded.
    pub sha256: String,
}

/// A file of a stored message, downloaded after the drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRead {
    pub conversation: u64,
    /// The body tag of the message that carries it.
    pub tag: String,
    pub attachment_id: u64,
    /// The SHA-256 of the bytes downloaded ("" when the download failed).
    pub sha256: String,
    /// Why the download failed.
    pub error: String,
}

/// An acknowledged request sent again — same request id, same body — after
/// a fault, as a client that lost the answer does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resend {
    pub conversation: u64,
    pub client_req_id: String,
    /// The answer to the first send.
    pub original: Outcome,
    /// The answer to the re-send.
    pub answer: Outcome,
    /// When the re-send was made (drill time).
    pub at_ms: u64,
}

/// A device that followed its user's sync queue through the drill.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Device {
    #[serde(default)]
    pub tenant: u64,
    pub user: u64,
    pub device: String,
    /// The conversations its user is a member of: every message
    /// acknowledged in them must reach the device.
    pub conversations: Vec<u64>,
    /// When the device was told its queue was replaced (a failed-over
    /// home). Events of the old queue it had not read are then the
    /// client's to fetch from history, so messages sent before the last
    /// rebase are not owed to its stream.
    pub rebases_ms: Vec<u64>,
}

/// One send: when it was invoked, when it completed, and what came back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendOp {
    pub conversation: u64,
    pub sender: u64,
    pub client_req_id: String,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok {
        msg_id: u64,
        seq: u64,
    },
    /// A definite rejection: the send did not happen.
    Rejected {
        code: String,
    },
    /// Timeout, lost connection, or an error that may have been applied.
    Unknown,
}

impl Outcome {
    /// What a client knows of a send from its answer: acknowledged, refused
    /// for certain, or unknown — a lost connection, a timeout, RETRY_LATER,
    /// INTERNAL or WRONG_CELL (the edge may have applied an earlier try).
    /// The one classifier of drills and tests; a call that timed out on
    /// the client's side is `Unknown` too.
    pub fn of_send(answer: Result<&SendResponse, &tonic::Status>) -> Self {
        match answer {
            Ok(r) => Outcome::Ok {
                msg_id: r.msg_id,
                seq: r.seq,
            },
            Err(status) => match error_code(status) {
                ErrorCode::RetryLater | ErrorCode::Internal | ErrorCode::WrongCell => {
                    Outcome::Unknown
                }
                code => Outcome::Rejected {
                    code: code.as_str_name().to_string(),
                },
            },
        }
    }
}

/// A message as read back after the drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub seq: u64,
    pub msg_id: u64,
    /// The body tag: the `client_req_id` of the send that wrote it.
    pub tag: String,
}

/// A push a device received.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// The tenant of the device's user (user ids are per tenant).
    #[serde(default)]
    pub tenant: u64,
    pub user: u64,
    pub device: String,
    /// Increments each time the device (re)subscribes.
    pub session: u64,
    pub pts: u64,
    pub conversation: u64,
    pub seq: u64,
    pub kind: i32,
    /// The queue `pts` counts in (a failed-over home starts a new one).
    #[serde(default)]
    pub queue: u64,
    /// When it arrived (drill time).
    #[serde(default)]
    pub at_ms: u64,
}

/// A cursor the server confirmed for a device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CursorAck {
    #[serde(default)]
    pub tenant: u64,
    pub user: u64,
    pub device: String,
    pub at_ms: u64,
    pub cursor: u64,
    /// The queue the cursor counts in.
    #[serde(default)]
    pub queue: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub conversation: u64,
    pub first: u64,
    pub last: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Floor {
    pub conversation: u64,
    pub floor: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcceptedWrite {
    pub cell: String,
    pub conversation: u64,
    pub epoch: u64,
    pub seq: u64,
    pub at_ms: u64,
}

/// A conversation moved from `source` to `target`, with both histories read
/// back at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Migration {
    pub conversation: u64,
    pub source: String,
    pub target: String,
    pub switch_ms: u64,
    pub source_history: Vec<Stored>,
    pub target_history: Vec<Stored>,
}
