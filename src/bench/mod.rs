//! `cellmesh bench`: load generators. Each scenario prints a summary and
//! can write the same figures as JSON (`--json FILE`) with the keys
//! `scenario`, `acked`, `errors`, `throughput_per_s`, `latency_ms.{p50,p99,p999}`.

mod failover;
mod migrate;
mod push;
mod report;
mod router;
mod send;

use std::collections::BTreeMap;

use cellmesh_proto::status::error_code;
use cellmesh_proto::v1::{MessageType, SendRequest};
use clap::{Args, Subcommand};

pub use report::Report;

use crate::client::caller;

/// A send as the benchmarks issue it: one unique request id each.
pub fn send_request(
    tenant: u64,
    user: u64,
    conversation: u64,
    client_req_id: String,
    kind: MessageType,
    body: Vec<u8>,
) -> SendRequest {
    SendRequest {
        caller: caller(tenant, user),
        conversation_id: conversation,
        client_req_id,
        r#type: kind as i32,
        body,
        route_epoch: 0,
        visible_to: Vec::new(),
    }
}

/// Counts a failed call under its stable code.
pub fn count_error(errors: &mut BTreeMap<String, u64>, status: &tonic::Status) {
    let code = error_code(status).as_str_name().to_string();
    *errors.entry(code).or_insert(0) += 1;
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Concurrent idempotent sends into many conversations; measures acked
    /// sends per second and ack latency.
    Send(send::SendArgs),
    /// Online devices receive pushes while senders send into 1:1 and group
    /// conversations; measures send→push latency and deliveries per second.
    Push(push::PushArgs),
    /// Route writes and lookups against the RoutingService, or the same
    /// workload against etcd for comparison.
    Router(router::RouterArgs),
    /// Live conversation moves on a running `cellmesh dev`: messages copied
    /// per second and the freeze window.
    Migrate(migrate::MigrateArgs),
    /// Hangs the cell owning the demo conversation of a running `cellmesh
    /// dev` and measures the time to the first accepted send.
    Failover(failover::FailoverArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::Send(args) => send::run(args).await,
        Scenario::Push(args) => push::run(args).await,
        Scenario::Router(args) => router::run(args).await,
        Scenario::Migrate(args) => migrate::run(args).await,
        Scenario::Failover(args) => failover::run(args).await,
    }
}

/// A running `cellmesh dev` as a bench target: its eu-west edge, the demo
/// tenant, and tokens for any user signed with the deployment's token secret.
pub struct DevTarget {
    pub edge: String,
    pub tenant: u64,
    key: cellmesh_router::edge::auth::TokenKey,
}

impl DevTarget {
    pub fn load(dir: &std::path::Path) -> anyhow::Result<Self> {
        let read = |name: &str| -> anyhow::Result<serde_json::Value> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                anyhow::anyhow!(
                    "cannot read {} (is `cellmesh dev` running?): {e}",
                    path.display()
                )
            })?;
            Ok(serde_json::from_str(&text)?)
        };
        let info = read("dev.json")?;
        let secrets = read("secrets.json")?;
        Ok(Self {
            edge: info["edges"]["eu-west"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            tenant: info["demo"]["tenant"].as_u64().unwrap_or(1),
            key: cellmesh_router::edge::auth::TokenKey::new(
                secrets["token"].as_str().unwrap_or_default(),
            ),
        })
    }

    /// `message` as `user` of the demo tenant, with a fresh token.
    pub fn request<T>(&self, message: T, user: u64) -> tonic::Request<T> {
        let token = self.key.issue(&cellmesh_router::edge::auth::Claims {
            tenant: self.tenant,
            user,
            device: "bench".into(),
            exp: cellmesh_router::edge::auth::now_secs() + 3600,
        });
        let mut request = tonic::Request::new(message);
        if let Ok(v) = format!("Bearer {token}").parse() {
            request.metadata_mut().insert("authorization", v);
        }
        request
    }
}
