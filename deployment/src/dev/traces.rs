//! Where the processes of `cellmesh dev` send their spans: to the OTLP
//! collector `--otlp` names, or else to a receiver in the dev process
//! that keeps the last traces in memory and answers `GET /traces` for the
//! console's waterfall.

use anyhow::Context;
use cellmesh_telemetry::trace::receiver::Receiver;
use tokio::task::JoinHandle;

use super::topology::Topology;

/// Traces kept by the embedded receiver.
const KEPT: usize = 500;

pub struct Traces {
    /// The OTLP endpoint every process exports to.
    pub endpoint: String,
    /// Where the embedded receiver answers queries (none with `--otlp`).
    pub query_url: Option<String>,
    tasks: Vec<JoinHandle<()>>,
}

impl Traces {
    pub async fn start(topo: &Topology, otlp: Option<String>) -> anyhow::Result<Self> {
        if let Some(endpoint) = otlp {
            return Ok(Self {
                endpoint,
                query_url: None,
                tasks: Vec::new(),
            });
        }
        let (otlp_port, query_port) = topo.trace_ports();
        let bind = |port: u16| async move {
            tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .with_context(|| format!("cannot listen on port {port} for traces"))
        };
        let receiver = Receiver::new(KEPT);
        let grpc = receiver.serve(bind(otlp_port).await?);
        let query = bind(query_port).await?;
        let app = receiver.http();
        let http = tokio::spawn(async move {
            if let Err(e) = axum::serve(query, app).await {
                tracing::warn!(error = %e, "trace queries stopped");
            }
        });
        Ok(Self {
            endpoint: format!("http://127.0.0.1:{otlp_port}"),
            query_url: Some(format!("http://127.0.0.1:{query_port}")),
            tasks: vec![grpc, http],
        })
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
