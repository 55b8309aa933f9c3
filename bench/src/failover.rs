//! `cellmesh bench failover --dev DATA_DIR`: freezes (SIGSTOP) the cell that
//! owns the demo tenant of a running `cellmesh dev`, sends through the edge
//! until a send is accepted again, and reports the time from the fault to
//! that first accepted send; the stopped cell is resumed (SIGCONT) after
//! each round. A hung process, not a killed one: the supervisor would
//! restart a killed cell before the failover fires.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{MessageType, SendRequest};
use cellmesh_route_client::table::Key;
use clap::Args;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use crate::Report;
use cellmesh_chaos::target::DevTarget;

#[derive(Args)]
pub struct FailoverArgs {
    /// The data dir of a running `cellmesh dev`.
    #[arg(long)]
    dev: PathBuf,
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    let dev = DevTarget::load(&args.dev)?;
    // The demo 1:1 conversation, written as demo user 1.
    let conv = *dev
        .conversations
        .get(1)
        .ok_or_else(|| anyhow::anyhow!("no demo 1:1 conversation in dev.json"))?;
    let routes = dev.routes().await?;
    let mut client = MessagingClient::new(Channel::from_shared(dev.edge.clone())?.connect().await?);
    let mut times = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut switches = Vec::new();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for round in 0..args.rounds {
        let key = Key::conversation(TenantId(dev.tenant), ConversationId(conv));
        let owner = routes
            .resolve(&key)
            .map(|r| r.entry.cell)
            .ok_or_else(|| anyhow::anyhow!("conversation {conv} has no route"))?;
        let pid = dev
            .cell_pids()?
            .into_iter()
            .find_map(|(id, pid)| (id == owner).then_some(pid))
            .ok_or_else(|| anyhow::anyhow!("no process for {owner} in dev.json"))?;
        // SAFETY: signals to a process of the dev deployment.
        unsafe {
            libc::kill(pid, libc::SIGSTOP);
        }
        let fault = Instant::now();
        // When this process's copy of the route table shows the new owner.
        let mut switched = {
            let (routes, owner) = (routes.clone(), owner.clone());
            tokio::spawn(async move {
                while routes.resolve(&key).is_none_or(|r| r.entry.cell == owner) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                fault.elapsed()
            })
        };
        let mut n = 0;
        let took = loop {
            n += 1;
            let mut request = dev.request(
                SendRequest {
                    conversation_id: conv,
                    client_req_id: format!("bf-{run}-{round}-{n}"),
                    r#type: MessageType::Text as i32,
                    body: b"failover probe".to_vec(),
                    ..Default::default()
                },
                1,
            );
            request.set_timeout(Duration::from_millis(250));
            if client.send(request).await.is_ok() {
                break fault.elapsed();
            }
            if fault.elapsed() > Duration::from_secs(120) {
                unsafe {
                    libc::kill(pid, libc::SIGCONT);
                }
                anyhow::bail!("no send accepted within 120 s of stopping {owner}");
            }
        };
        unsafe {
            libc::kill(pid, libc::SIGCONT);
        }
        let now_owner = routes
            .resolve(&key)
            .map(|r| r.entry.cell)
            .unwrap_or_default();
        // 0: this process never saw the route move (within 5 s more).
        let switch = tokio::time::timeout(Duration::from_secs(5), &mut switched)
            .await
            .map_or(0, |s| s.map_or(0, |d| d.as_millis() as u64));
        switched.abort();
        switches.push(switch);
        println!(
            "round {round}: {owner} hung; route switched after {switch} ms, first send accepted on {now_owner} after {} ms",
            took.as_millis()
        );
        let _ = times.record(took.as_micros() as u64);
        // Let the resumed cell be seen healthy again before the next round.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let report = Report::new(
        "failover",
        u64::from(args.rounds),
        BTreeMap::new(),
        Duration::ZERO,
        &times,
    )
    .param(
        "latency_is",
        "fault (SIGSTOP of the owning cell) to first accepted send",
    )
    .param("route_switched_ms", switches);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}
