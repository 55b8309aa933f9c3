//! `cellmesh bench`: load generators. Each scenario prints a summary and
//! can write the same figures as JSON (`--json FILE`) with the keys
//! `scenario`, `acked`, `errors`, `throughput_per_s`, `latency_ms.{p50,p99,p999}`.

mod push;
mod report;
mod send;

use clap::{Args, Subcommand};

pub use report::Report;

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
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::Send(args) => send::run(args).await,
        Scenario::Push(args) => push::run(args).await,
    }
}
