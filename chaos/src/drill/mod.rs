//! `cellmesh chaos run SCENARIO --dev DATA_DIR`: a drill against a running
//! `cellmesh dev`. Senders write through the edge with unique request ids
//! and record every outcome ([`workload`]); faults are injected on a
//! schedule drawn from the seed ([`faults`]); afterwards every conversation
//! is read back and the history checker judges each invariant of DESIGN.md
//! §7. A neighbour tenant shares the demo tenant's cell with the same user
//! ids, writing and followed by devices too: no device may see the other
//! tenant's events. The report ([`report`]: JSON and a summary) lists the faults with
//! times and recovery times, the outcomes and every verdict; any violation
//! makes the command fail.

mod devices;
mod failovers;
mod faults;
mod files;
mod inject;
mod move_failover;
mod region_loss;
mod report;
mod residency;
mod rolling;
mod tenant_moves;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use crate::check_all;
use crate::history::History;
use clap::{Args, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::target::DevTarget;
use faults::{FaultKind, Injector};
use workload::Workload;

#[derive(Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    command: ChaosCommand,
}

#[derive(Subcommand)]
enum ChaosCommand {
    /// Run one drill and judge it.
    Run(RunArgs),
}

#[derive(Clone, Copy, ValueEnum, Debug)]
enum Scenario {
    /// SIGKILL a random cell now and then (the dev supervisor restarts it).
    CellKill,
    /// SIGSTOP a random cell for a while (failover), then SIGCONT.
    CellHang,
    /// SIGKILL the route table's Raft leader; a new one is elected.
    RouterLeaderKill,
    /// SIGSTOP the route table's Raft leader for 6 s, then SIGCONT; cells
    /// keep writing what they own while a new leader is elected.
    RouterLeaderHang,
    /// Move the drill's conversations live to other cells while they are
    /// written.
    MigrationUnderLoad,
    /// Move a conversation and SIGKILL its source cell mid-copy, then
    /// resume the move.
    MigrationSourceKill,
    /// Move the whole drill tenant to another cell, and on or back at each
    /// next fault: one workflow, one freeze, one switch each time.
    TenantMove,
    /// The same, with the source or the target SIGKILLed mid-copy (the
    /// supervisor restarts it), then the move resumed.
    TenantMoveKill,
    /// Move drill conversations live to another cell, then hang that new
    /// owner (SIGSTOP) until the control plane fails it over, then SIGCONT.
    MoveThenFailOver,
    /// Stop a migration after a random phase, SIGKILL the active
    /// control-plane replica, then resume the move.
    ControlPlaneKillMidMigration,
    /// Move a conversation while its target crashes between storing a
    /// copied chunk and answering (fail point `migration.copy_stored`), then
    /// resume the move once the target is back. Needs `--features
    /// failpoints`.
    MigrationTargetCrash,
    /// Cut a region (us-east or ap-south, from the seed) off from the
    /// others, with the drill's conversations living there and senders on
    /// both sides, then heal.
    RegionPartition,
    /// Every write batch of a cell owning drill conversations waits 200 ms
    /// for a while (fail point `storage.slow_write`; needs a build with
    /// `--features failpoints`).
    SlowDisk,
    /// The cells owning drill conversations cannot publish to their event
    /// queue for a while (fail point `queue.publish`); fan-out resumes
    /// after. Needs `--features failpoints`.
    QueueOutage,
    /// A Kafka broker goes down for a while, then up (needs `cellmesh dev
    /// --kafka mock`); fan-out resumes after.
    BrokerOutage,
    /// Kills, hangs and router-leader kills, chosen from the seed.
    Mixed,
    /// A deployment started on the previous release (`cellmesh dev
    /// --process-binary PREVIOUS`) moved to this binary one component at a
    /// time, the drill tenant moved onto the first cell upgraded (a
    /// canary), that cell and one router rolled back and forward again,
    /// then the cluster version finalized (needs `--previous`).
    RollingUpgrade,
    /// Back up the cells of a region (us-east or ap-south, from the seed),
    /// then kill every process of it and delete their data; the cells fail
    /// over to standbys in other regions; then rebuild the region (router
    /// from its peers, cells from their backups) and fail back. Reports RTO
    /// and RPO for a sync tenant (the drill's) and an async one (needs
    /// `cellmesh dev --replication sync --other-mode-tenants 9002`).
    RegionLoss,
}

#[derive(Args)]
struct RunArgs {
    #[arg(value_enum)]
    scenario: Scenario,
    /// The data dir of a running `cellmesh dev`.
    #[arg(long)]
    dev: PathBuf,
    #[arg(long, default_value = "30s")]
    duration: humantime::Duration,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 4)]
    senders: u64,
    #[arg(long, default_value_t = 4)]
    conversations: u64,
    /// Write the report here as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// The previous release's binary (`rolling-upgrade`).
    #[arg(long)]
    previous: Option<PathBuf>,
    /// Binds the drill tenant to these regions for the drill (its moves
    /// stay inside them), then audits that no cell outside them holds a
    /// byte of the drill's messages or a cold segment of the tenant.
    #[arg(long, value_delimiter = ',')]
    pin_regions: Vec<String>,
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    match args.command {
        ChaosCommand::Run(args) => {
            let span = tracing::info_span!(
                "drill",
                scenario = ?args.scenario,
                cellmesh.always_sample = true,
            );
            drill(args).instrument(span).await
        }
    }
}

impl ChaosArgs {
    /// Where the drill's trace goes: the deployment's OTLP endpoint from
    /// its dev.json (none when it names none).
    pub fn traces(&self) -> cellmesh_telemetry::trace::TraceConfig {
        let ChaosCommand::Run(run) = &self.command;
        let endpoint = std::fs::read_to_string(run.dev.join("dev.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|info| info["traces"]["otlp"].as_str().map(str::to_string))
            .unwrap_or_default();
        cellmesh_telemetry::trace::TraceConfig {
            endpoint,
            ..Default::default()
        }
    }
}

/// The region a partition drill cuts off: never eu-west, where the drill's
/// first edge and the control plane live.
fn partitioned_region(rng: &mut StdRng) -> &'static str {
    ["us-east", "ap-south"][rng.random_range(0..2)]
}

fn next_fault(
    scenario: Scenario,
    rng: &mut StdRng,
    period: Duration,
    region: &'static str,
) -> FaultKind {
    match scenario {
        Scenario::RegionPartition => FaultKind::RegionPartition {
            region,
            hold: period * 2 / 3,
        },
        Scenario::CellKill => FaultKind::CellKill,
        Scenario::CellHang => FaultKind::CellHang,
        Scenario::RouterLeaderKill => FaultKind::RouterLeaderKill,
        Scenario::RouterLeaderHang => FaultKind::RouterLeaderHang {
            hold: Duration::from_secs(6),
        },
        Scenario::MigrationUnderLoad => FaultKind::Migrate,
        Scenario::MigrationSourceKill => FaultKind::MigrationSourceKill,
        Scenario::TenantMove => FaultKind::TenantMove,
        Scenario::MoveThenFailOver => FaultKind::MoveThenFailOver,
        Scenario::TenantMoveKill => FaultKind::TenantMoveKill,
        Scenario::ControlPlaneKillMidMigration => FaultKind::ControlPlaneKillMidMigration,
        Scenario::MigrationTargetCrash => FaultKind::MigrationTargetCrash,
        Scenario::BrokerOutage => FaultKind::BrokerOutage { hold: period / 2 },
        Scenario::SlowDisk => FaultKind::FailPoint {
            what: "slow disk",
            spec: "storage.slow_write=delay(200ms)",
            hold: period / 2,
        },
        Scenario::QueueOutage => FaultKind::FailPoint {
            what: "queue outage",
            spec: "queue.publish=error",
            hold: period / 2,
        },
        Scenario::RollingUpgrade | Scenario::RegionLoss => {
            unreachable!("a rolling upgrade and a region loss follow their plans")
        }
        Scenario::Mixed => match rng.random_range(0..5) {
            0 | 1 => FaultKind::CellKill,
            2 | 3 => FaultKind::CellHang,
            _ => FaultKind::RouterLeaderKill,
        },
    }
}

/// How long the deployment settles after the senders stop.
const SETTLE: Duration = Duration::from_secs(5);

/// Acknowledged requests sent again after each fault.
const RESENDS_PER_FAULT: usize = 5;
/// How long before a fault a request's ack must have come for its re-send
/// to be owed its first answer: answers reach the standbys after the ack,
/// through the forward queue, and a failover inside that window may not
/// find them (see the README on idempotent sends).
const REPLICATION_WINDOW_MS: u64 = 1_000;
/// Mixed into the seed for the choice of re-sends, so that the fault
/// schedule stays what the seed alone gives.
const RESEND_SEED: u64 = 0x5e5e_5e5e;

/// Up to [`RESENDS_PER_FAULT`] sends into `conversations` acknowledged at least
/// [`REPLICATION_WINDOW_MS`] before `fault_ms`, drawn at random.
fn resend_sample(
    ops: &[crate::history::SendOp],
    conversations: &[u64],
    fault_ms: u64,
    rng: &mut StdRng,
) -> Vec<crate::history::SendOp> {
    use crate::history::Outcome;
    let acked: Vec<_> = ops
        .iter()
        .filter(|op| {
            matches!(op.outcome, Outcome::Ok { .. })
                && conversations.contains(&op.conversation)
                && op.completed_ms + REPLICATION_WINDOW_MS <= fault_ms
        })
        .collect();
    (0..RESENDS_PER_FAULT.min(acked.len()))
        .map(|_| acked[rng.random_range(0..acked.len())].clone())
        .collect()
}

/// The tenant placed beside the demo tenant, with the same user ids.
const NEIGHBOUR_TENANT: u64 = 9_001;

/// Places the neighbour tenant on the demo tenant's cell (once per
/// deployment) and creates its conversation among the same user ids as the
/// drill's senders.
async fn neighbour(dev: &Arc<DevTarget>, senders: u64) -> anyhow::Result<Workload> {
    anyhow::ensure!(
        dev.tenant != NEIGHBOUR_TENANT,
        "the demo tenant is the neighbour's id"
    );
    dev.place_beside_demo(NEIGHBOUR_TENANT).await?;
    placed_workload(dev, NEIGHBOUR_TENANT, senders, 1).await
}

/// A workload of a tenant just placed: the edges learn it from the route
/// table's watch, so its creation is retried for a while.
async fn placed_workload(
    dev: &Arc<DevTarget>,
    tenant: u64,
    senders: u64,
    conversations: u64,
) -> anyhow::Result<Workload> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Workload::create(dev.clone(), tenant, senders, conversations).await {
            Ok(workload) => return Ok(workload),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn drill(args: RunArgs) -> anyhow::Result<()> {
    let dev = Arc::new(DevTarget::load(&args.dev)?);
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    residency::pin(&dev, &args.pin_regions).await?;
    let mut workload =
        Workload::create(dev.clone(), dev.tenant, args.senders, args.conversations).await?;
    let neighbour = neighbour(&dev, args.senders.min(2)).await?;
    println!(
        "drill {:?} seed {seed}: {} senders into {} conversations for {}, beside tenant {} with the same user ids",
        args.scenario,
        workload.senders.len(),
        workload.conversations.len(),
        args.duration,
        neighbour.tenant,
    );

    let mut injector = Injector::new(dev.clone(), workload.conversations.clone(), seed);
    let region = partitioned_region(&mut StdRng::seed_from_u64(seed));
    let probe = place_for(&args, &mut injector, &mut workload, region).await?;

    let follower = *workload.senders.get(1).unwrap_or(&workload.senders[0]);
    let warm = devices::wait_for_fan_out(
        &dev,
        &workload.channels[0],
        follower,
        &workload.conversations,
    )
    .await?;
    println!(
        "  fan-out works ({} ms after the conversations were created)",
        warm.as_millis()
    );

    let epoch = Instant::now();
    injector.epoch = epoch;
    let failovers = failovers::FailoverWatch::start(dev.routes().await?, epoch);
    let stop = epoch + Duration::from(args.duration);
    let ops = Arc::new(Mutex::new(Vec::new()));
    let mut workers = workload.start(epoch, stop, ops.clone());
    workers.extend(neighbour.start(epoch, stop, ops.clone()));
    if let Some(probe) = &probe {
        workers.extend(probe.workload.start(epoch, stop, probe.ops.clone()));
    }
    // Devices follow a member until they have caught up after the read-back.
    let device_log = Arc::new(Mutex::new(devices::DeviceLog::default()));
    let devices_stop = Arc::new(AtomicBool::new(false));
    let mut device_tasks = Vec::new();
    for load in [&workload, &neighbour] {
        device_tasks.extend(devices::start(
            dev.clone(),
            &load.channels,
            (load.tenant, follower, &load.conversations),
            epoch,
            devices_stop.clone(),
            device_log.clone(),
        ));
    }

    // Faults on a schedule drawn from the seed; after each, a few requests
    // acknowledged before it are sent again.
    let schedule = Schedule {
        scenario: args.scenario,
        period: (Duration::from(args.duration) / 4).max(Duration::from_secs(2)),
        stop,
        region,
        resend_seed: seed ^ RESEND_SEED,
        previous: args.previous.clone(),
    };
    let (faults, resends, region_loss) = schedule.run(&mut injector, &workload, &ops).await?;
    for w in workers {
        w.await?;
    }
    // Recovery is judged over the time the senders ran.
    let end_ms = workload::now_ms(epoch).min(Duration::from(args.duration).as_millis() as u64);
    let mut history = History {
        sends: std::mem::take(&mut *ops.lock().expect("ops")),
        ..History::default()
    };
    collect_resends(resends, &mut history).await?;
    // Read every conversation back once the deployment has settled.
    tokio::time::sleep(SETTLE).await;
    read_back(&[&workload, &neighbour], &mut history).await?;
    let caught_up_ms = devices::wait_caught_up(&history, &device_log).await;
    devices_stop.store(true, Ordering::Relaxed);
    if let Some(at) = caught_up_ms {
        println!(
            "  devices caught up {} ms after the senders stopped",
            at.saturating_sub(end_ms)
        );
    }
    for task in device_tasks {
        task.await?;
    }
    let moves = std::mem::take(&mut injector.moves);
    check_moves(&workload, moves, &mut history).await?;
    let log = std::mem::take(&mut *device_log.lock().expect("device log"));
    let idle_resubscribes = log.idle_resubscribes;
    println!("  devices subscribed again after {idle_resubscribes} quiet spells");
    history.deliveries = log.deliveries;
    history.cursor_acks = log.cursor_acks;
    history.devices = log.devices;

    let residency = residency::audit_and_unpin(&dev, &args.pin_regions, &workload.tags()).await?;
    let unknown_by_reason = Workload::unknown_reasons(&[&workload, &neighbour]);
    let region_loss = match (region_loss, probe) {
        (Some(measured), Some(probe)) => Some(measured.report(&history, &workload, probe).await?),
        _ => None,
    };
    let facts = RunFacts {
        seed,
        end_ms,
        failovers,
        caught_up_ms,
        idle_resubscribes,
        unknown_by_reason,
        region_loss,
        residency,
    };
    judge(&args, &history, &faults, facts)
}

/// Every conversation of `loads` read back into `history`, and what
/// became of the files sends named.
async fn read_back(loads: &[&Workload], history: &mut History) -> anyhow::Result<()> {
    for load in loads {
        load.read_back(history).await?;
    }
    let intact = (history.files_read.iter())
        .filter(|f| f.error.is_empty())
        .count();
    println!(
        "  {} sends named a file; {intact} of {} files on stored messages downloaded",
        history.files_sent.len(),
        history.files_read.len()
    );
    Ok(())
}

/// When faults come and what follows each.
struct Schedule {
    scenario: Scenario,
    period: Duration,
    stop: Instant,
    region: &'static str,
    resend_seed: u64,
    previous: Option<PathBuf>,
}

/// Re-sends of acknowledged requests: when, and the task answering them.
type Resends = Vec<(
    u64,
    tokio::task::JoinHandle<(crate::history::SendOp, crate::history::Outcome)>,
)>;

impl Schedule {
    /// Injects a fault every period until the senders stop; after each,
    /// re-sends a sample of the requests acknowledged before it.
    async fn run(
        &self,
        injector: &mut Injector,
        workload: &Workload,
        ops: &Mutex<Vec<crate::history::SendOp>>,
    ) -> anyhow::Result<(Vec<faults::Fault>, Resends, Option<region_loss::Measured>)> {
        let (mut faults, mut resends) = (Vec::new(), Vec::new());
        let mut resend_rng = StdRng::seed_from_u64(self.resend_seed);
        let mut after = |injector: &Injector, fault: &faults::Fault| {
            println!(
                "  {:>6} ms  {} {} {}",
                fault.at_ms, fault.kind, fault.target, fault.detail
            );
            let acked = ops.lock().expect("ops").clone();
            let sample = resend_sample(
                &acked,
                &workload.conversations,
                fault.at_ms,
                &mut resend_rng,
            );
            for op in sample {
                resends.push((workload::now_ms(injector.epoch), workload.resend(op)));
            }
        };
        if let Scenario::RollingUpgrade = self.scenario {
            let previous = (self.previous.as_deref())
                .ok_or_else(|| anyhow::anyhow!("rolling-upgrade needs --previous PATH"))?;
            let steps = rolling::plan(injector, previous).await?;
            let faults = rolling::run(injector, steps, after).await?;
            anyhow::ensure!(
                Instant::now() < self.stop,
                "the upgrade outlasted the senders: raise --duration"
            );
            return Ok((faults, resends, None));
        }
        if let Scenario::RegionLoss = self.scenario {
            let (faults, measured) = region_loss::run(injector, self.region, after).await?;
            anyhow::ensure!(
                Instant::now() < self.stop,
                "the region loss and rebuild outlasted the senders: raise --duration"
            );
            return Ok((faults, resends, Some(measured)));
        }
        while Instant::now() + self.period < self.stop {
            tokio::time::sleep(self.period).await;
            let kind = next_fault(self.scenario, &mut injector.rng, self.period, self.region);
            let fault = injector
                .inject(kind)
                .instrument(tracing::info_span!("fault"))
                .await?;
            after(injector, &fault);
            faults.push(fault);
        }
        Ok((faults, resends, None))
    }
}

/// Each finished move: what its source kept against what is served now.
async fn check_moves(
    workload: &Workload,
    moves: Vec<(u64, String, String, u64)>,
    history: &mut History,
) -> anyhow::Result<()> {
    for (conversation, source, target, switch_ms) in moves {
        let source_history = workload.source_copy(&source, conversation).await?;
        let target_history = history
            .conversations
            .get(&conversation)
            .cloned()
            .unwrap_or_default();
        history.migrations.push(crate::history::Migration {
            conversation,
            source,
            target,
            switch_ms,
            source_history,
            target_history,
        });
    }
    Ok(())
}

/// What the run measured besides its history.
struct RunFacts {
    seed: u64,
    /// When the senders stopped.
    end_ms: u64,
    /// Watching for failovers since the faults began.
    failovers: failovers::FailoverWatch,
    caught_up_ms: Option<u64>,
    idle_resubscribes: usize,
    unknown_by_reason: std::collections::BTreeMap<String, u64>,
    /// The region-loss drill's RTO and RPO.
    region_loss: Option<serde_json::Value>,
    /// With `--pin-regions`: what the audit found, and whether it held.
    residency: Option<serde_json::Value>,
}

/// Checks every invariant over the history, prints the report (and
/// writes it with `--report`); an error when one does not hold.
fn judge(
    args: &RunArgs,
    history: &History,
    faults: &[faults::Fault],
    facts: RunFacts,
) -> anyhow::Result<()> {
    let RunFacts {
        seed,
        end_ms,
        failovers,
        caught_up_ms,
        idle_resubscribes,
        unknown_by_reason,
        region_loss,
        residency,
    } = facts;
    let (failovers, unexplained) = failovers.finish(faults);
    let verdicts = check_all(history);
    let resident = residency.as_ref().is_none_or(|r| r["holds"] == true);
    let ok = verdicts.iter().all(|v| v.holds) && resident;
    let summary = report::summarize(history);
    let mut fault_records = Vec::new();
    for (i, fault) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map_or(end_ms, |f| f.at_ms);
        let recovery = report::recovery(fault, history, until);
        println!("  fault at {} ms: {recovery}", fault.at_ms);
        let mut record = fault.to_json();
        record["recovery"] = recovery;
        fault_records.push(record);
    }
    if !unknown_by_reason.is_empty() {
        println!("refusals and unknown outcomes by reason: {unknown_by_reason:?}");
    }
    let seen = failovers["seen"].as_array().map_or(0, Vec::len);
    println!(
        "  failovers: {seen}, of which {unexplained} without a fault on the cell or its region"
    );
    let out = json!({
        "scenario": format!("{:?}", args.scenario),
        "seed": seed,
        "duration_ms": Duration::from(args.duration).as_millis() as u64,
        "faults": fault_records,
        "operations": {"acked": summary.acked, "rejected": summary.rejected,
            "rejected_by_code": summary.rejected_by_code, "unknown": summary.unknown,
            "by_reason": unknown_by_reason},
        "devices": {"deliveries": summary.deliveries, "subscriptions": summary.sessions,
            "caught_up_at_ms": caught_up_ms, "ack_to_device_ms": summary.delivery_lag_ms,
            "idle_resubscribes": idle_resubscribes},
        "moves_checked": summary.moves,
        "failovers": failovers,
        "region_loss": region_loss,
        "residency": residency,
        "verdicts": verdicts,
        "ok": ok,
    });
    report::print(&summary, &verdicts);
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")?;
    }
    anyhow::ensure!(
        resident,
        "the residency audit failed (seed {seed}): bytes outside the pinned regions, or none inside"
    );
    anyhow::ensure!(
        ok,
        "the drill found violations (seed {seed}); see the report"
    );
    println!("verdict: every invariant holds");
    Ok(())
}

/// The answers to the re-sends, into the history.
async fn collect_resends(resends: Resends, history: &mut History) -> anyhow::Result<()> {
    for (at_ms, task) in resends {
        let (op, answer) = task.await?;
        history.resends.push(crate::history::Resend {
            conversation: op.conversation,
            client_req_id: op.client_req_id,
            original: op.outcome,
            answer,
            at_ms,
        });
    }
    let first_answers = (history.resends.iter())
        .filter(|r| r.answer == r.original)
        .count();
    println!(
        "  {} acknowledged requests re-sent after the faults, {first_answers} answered as the first time",
        history.resends.len()
    );
    Ok(())
}

/// Where the scenario wants the drill's conversations before the load:
/// inside the region a partition cuts off, or on the cells a region loss
/// takes (with the asynchronous tenant's load, returned).
async fn place_for(
    args: &RunArgs,
    injector: &mut Injector,
    workload: &mut Workload,
    region: &'static str,
) -> anyhow::Result<Option<region_loss::Probe>> {
    let dev = injector.dev.clone();
    match args.scenario {
        Scenario::RegionPartition => {
            inside_region(&dev, injector, workload, region).await?;
            Ok(None)
        }
        Scenario::RegionLoss => {
            let senders = args.senders.min(2);
            Ok(Some(
                region_loss::prepare(&dev, injector, region, senders).await?,
            ))
        }
        _ => Ok(None),
    }
}

/// The conversations live in the region to be cut off, and senders
/// write from inside it too.
async fn inside_region(
    dev: &DevTarget,
    injector: &mut Injector,
    workload: &mut Workload,
    region: &str,
) -> anyhow::Result<()> {
    // The conversations live in the region to be cut off, and senders
    // write from inside it too.
    injector.place_all(&format!("{region}/c1")).await?;
    let edge = dev
        .edge_by_region
        .get(region)
        .ok_or_else(|| anyhow::anyhow!("no {region} edge in dev.json"))?;
    workload.add_edge(edge).await?;
    println!("  conversations placed on {region}/c1; senders on eu-west and {region}");
    Ok(())
}
