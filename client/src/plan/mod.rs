//! `cellmesh plan`: sizes a deployment from its expected load. The
//! formulas are pure ([`size`]): messages a day = DAU × messages per user a
//! day × factor; write QPS = messages a day / 86,400 × peak factor;
//! storage = messages × size × retention × replicas, split into a hot share
//! (the last `hot_days`, on the cells' disks) and a cold share (object
//! storage); attachments = messages × share with a file × mean file size ×
//! retention (object storage), and their egress a day = files a day × mean
//! size × downloads per file. Per-cell capacity comes from `bench send` JSON files when
//! given (their acknowledged sends per second), else from the default
//! stated in the README. The output is a table, JSON, or the
//! `terraform.tfvars.json` of `terraform/envs/example`.

mod tfvars;

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Serialize;

pub use tfvars::tfvars;

/// Sends a second one cell takes when no bench file says otherwise: a
/// release build's `bench send` on 2 cores, rounded down.
pub const DEFAULT_CELL_WRITES_PER_S: f64 = 2_000.0;
/// A cell is planned to run at this share of its measured capacity.
pub const TARGET_UTILISATION: f64 = 0.5;
/// Writes a second one Kafka partition is planned for.
pub const PARTITION_WRITES_PER_S: f64 = 500.0;
/// Free space kept on every data volume.
pub const DISK_HEADROOM: f64 = 1.5;

#[derive(clap::Args, Debug, Clone)]
pub struct PlanArgs {
    /// Daily active users.
    #[arg(long)]
    pub dau: u64,
    /// Messages a user sends a day.
    #[arg(long, default_value_t = 60.0)]
    pub messages_per_user: f64,
    /// Multiplier on messages (system messages, edits, recalls).
    #[arg(long, default_value_t = 1.0)]
    pub factor: f64,
    /// Peak write rate over the daily average.
    #[arg(long, default_value_t = 3.0)]
    pub peak_factor: f64,
    /// Average stored size of a message, bytes.
    #[arg(long, default_value_t = 1200)]
    pub message_bytes: u64,
    /// Days of history kept.
    #[arg(long, default_value_t = 90)]
    pub retention_days: u64,
    /// Days of history kept hot on the cells' disks (the rest is cold).
    #[arg(long, default_value_t = 14)]
    pub hot_days: u64,
    /// Copies of each hot message (the owner and its standbys).
    #[arg(long, default_value_t = 3)]
    pub replicas: u64,
    /// Share of messages that carry a file (0..=1).
    #[arg(long, default_value_t = 0.1)]
    pub file_share: f64,
    /// Mean size of a file, bytes.
    #[arg(long, default_value_t = 200_000)]
    pub file_bytes: u64,
    /// Times a file is downloaded on average (its recipients' devices).
    #[arg(long, default_value_t = 3.0)]
    pub downloads_per_file: f64,
    /// Regions, comma-separated (users are split evenly over them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eu-west-1,us-east-1,ap-southeast-1"
    )]
    pub regions: Vec<String>,
    /// `bench send` JSON files measuring one cell; the lowest throughput
    /// among them is taken.
    #[arg(long = "bench")]
    pub bench: Vec<PathBuf>,
    /// Use the scale-out queue (MSK) instead of the embedded one.
    #[arg(long)]
    pub kafka: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write `terraform.tfvars.json` for `terraform/envs/example` here.
    #[arg(long, value_name = "FILE")]
    pub tfvars: Option<PathBuf>,
}

/// What the load is.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub dau: u64,
    pub messages_per_user: f64,
    pub factor: f64,
    pub peak_factor: f64,
    pub message_bytes: u64,
    pub retention_days: u64,
    pub hot_days: u64,
    pub replicas: u64,
    pub file_share: f64,
    pub file_bytes: u64,
    pub downloads_per_file: f64,
    pub regions: Vec<String>,
    pub cell_writes_per_s: f64,
    pub kafka: bool,
}

/// The plan.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Plan {
    pub messages_per_day: f64,
    pub writes_per_s_average: f64,
    pub writes_per_s_peak: f64,
    /// All history over the retention, every replica (bytes).
    pub storage_bytes: f64,
    /// On the cells' disks (the hot days, every replica).
    pub hot_bytes: f64,
    /// In object storage (one copy; the store replicates itself).
    pub cold_bytes: f64,
    /// Files over the retention, in the regions' buckets (bytes).
    pub attachment_bytes: f64,
    /// File bytes downloaded a day (egress from the buckets).
    pub attachment_egress_bytes_per_day: f64,
    pub cell_writes_per_s: f64,
    pub router_replicas: u64,
    pub regions: Vec<RegionPlan>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RegionPlan {
    pub name: String,
    pub writes_per_s_peak: f64,
    pub cells: u64,
    pub router_replicas: u64,
    /// Data volume of each cell, GiB.
    pub disk_gib_per_cell: u64,
    /// Zero without Kafka.
    pub kafka_partitions: u64,
}

/// Errors in the load that no plan can answer.
pub fn check(load: &Load) -> anyhow::Result<()> {
    if load.dau == 0 {
        bail!("--dau: must be at least 1");
    }
    for (name, v) in [
        ("--messages-per-user", load.messages_per_user),
        ("--factor", load.factor),
        ("--peak-factor", load.peak_factor),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{name}: must be a positive number");
        }
    }
    if load.peak_factor < 1.0 {
        bail!("--peak-factor: a peak is at least the average (1.0)");
    }
    if load.message_bytes == 0 || load.retention_days == 0 || load.replicas == 0 {
        bail!("--message-bytes, --retention-days and --replicas must be at least 1");
    }
    if load.hot_days > load.retention_days {
        bail!(
            "--hot-days: at most --retention-days ({})",
            load.retention_days
        );
    }
    if !(0.0..=1.0).contains(&load.file_share) {
        bail!("--file-share: a share between 0 and 1");
    }
    if !(load.downloads_per_file.is_finite() && load.downloads_per_file >= 0.0) {
        bail!("--downloads-per-file: must be a number, at least 0");
    }
    if load.regions.is_empty() || load.regions.iter().any(|r| r.trim().is_empty()) {
        bail!("--regions: name at least one region, none empty");
    }
    if !(load.cell_writes_per_s.is_finite() && load.cell_writes_per_s > 0.0) {
        bail!("the per-cell capacity must be a positive number of writes a second");
    }
    Ok(())
}

/// The plan for `load` (see the module doc for the formulas).
pub fn size(load: &Load) -> Plan {
    let messages_per_day = load.dau as f64 * load.messages_per_user * load.factor;
    let average = messages_per_day / 86_400.0;
    let peak = average * load.peak_factor;
    let per_copy = messages_per_day * load.message_bytes as f64 * load.retention_days as f64;
    let storage = per_copy * load.replicas as f64;
    let hot_share = load.hot_days as f64 / load.retention_days as f64;
    let hot = storage * hot_share;
    let cold = per_copy * (1.0 - hot_share);
    let files_per_day = messages_per_day * load.file_share;
    let file_bytes_per_day = files_per_day * load.file_bytes as f64;
    let n = load.regions.len() as u64;
    // An odd group, at least three, spread round-robin over the regions.
    let routers = if n < 3 {
        3
    } else if n % 2 == 1 {
        n
    } else {
        n + 1
    };
    let regions = load
        .regions
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let region_peak = peak / n as f64;
            // At least two cells: a cell's standby is another cell.
            let cells = ((region_peak / (load.cell_writes_per_s * TARGET_UTILISATION)).ceil()
                as u64)
                .max(2);
            let disk = hot / n as f64 / cells as f64 * DISK_HEADROOM;
            let partitions = if load.kafka {
                let p = (region_peak / PARTITION_WRITES_PER_S).ceil() as u64;
                // A multiple of the cells, so each consumes evenly.
                p.max(cells).div_ceil(cells) * cells
            } else {
                0
            };
            RegionPlan {
                name: name.trim().to_string(),
                writes_per_s_peak: region_peak,
                cells,
                router_replicas: routers / n + u64::from((i as u64) < routers % n),
                disk_gib_per_cell: ((disk / (1u64 << 30) as f64).ceil() as u64).max(20),
                kafka_partitions: partitions,
            }
        })
        .collect();
    Plan {
        messages_per_day,
        writes_per_s_average: average,
        writes_per_s_peak: peak,
        storage_bytes: storage,
        hot_bytes: hot,
        cold_bytes: cold,
        attachment_bytes: file_bytes_per_day * load.retention_days as f64,
        attachment_egress_bytes_per_day: file_bytes_per_day * load.downloads_per_file,
        cell_writes_per_s: load.cell_writes_per_s,
        router_replicas: routers,
        regions,
    }
}

/// The lowest acknowledged sends a second among `bench send` JSON files.
fn measured_capacity(files: &[PathBuf]) -> anyhow::Result<Option<f64>> {
    let mut lowest: Option<f64> = None;
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("--bench {}: cannot read", file.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("--bench {}: not JSON", file.display()))?;
        let scenario = json.get("scenario").and_then(|v| v.as_str());
        if scenario != Some("send") {
            bail!(
                "--bench {}: scenario {scenario:?}, not a `bench send --json` file",
                file.display()
            );
        }
        let rate = json
            .get("throughput_per_s")
            .and_then(|v| v.as_f64())
            .with_context(|| format!("--bench {}: no throughput_per_s", file.display()))?;
        lowest = Some(lowest.map_or(rate, |l: f64| l.min(rate)));
    }
    Ok(lowest)
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let load = Load {
        dau: args.dau,
        messages_per_user: args.messages_per_user,
        factor: args.factor,
        peak_factor: args.peak_factor,
        message_bytes: args.message_bytes,
        retention_days: args.retention_days,
        hot_days: args.hot_days,
        replicas: args.replicas,
        file_share: args.file_share,
        file_bytes: args.file_bytes,
        downloads_per_file: args.downloads_per_file,
        regions: args.regions.clone(),
        cell_writes_per_s: measured_capacity(&args.bench)?.unwrap_or(DEFAULT_CELL_WRITES_PER_S),
        kafka: args.kafka,
    };
    check(&load)?;
    let plan = size(&load);
    if let Some(path) = &args.tfvars {
        let text = serde_json::to_string_pretty(&tfvars(&plan, &load))?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("--tfvars {}: cannot write", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print_table(&plan);
    }
    Ok(())
}

fn print_table(plan: &Plan) {
    const TB: f64 = 1e12;
    println!(
        "{:.1} M messages a day: {:.0} writes/s on average, {:.0} at peak",
        plan.messages_per_day / 1e6,
        plan.writes_per_s_average,
        plan.writes_per_s_peak
    );
    println!(
        "storage {:.2} TB ({:.2} TB hot on cells, {:.2} TB cold in object storage); a cell planned at {:.0} writes/s ({}% of {:.0})",
        plan.storage_bytes / TB,
        plan.hot_bytes / TB,
        plan.cold_bytes / TB,
        plan.cell_writes_per_s * TARGET_UTILISATION,
        (TARGET_UTILISATION * 100.0) as u32,
        plan.cell_writes_per_s
    );
    println!(
        "attachments {:.2} TB in the buckets; egress {:.2} TB a day",
        plan.attachment_bytes / TB,
        plan.attachment_egress_bytes_per_day / TB
    );
    println!(
        "{:<18} {:>12} {:>6} {:>8} {:>10} {:>10}",
        "region", "peak w/s", "cells", "routers", "disk GiB", "partitions"
    );
    for r in &plan.regions {
        println!(
            "{:<18} {:>12.0} {:>6} {:>8} {:>10} {:>10}",
            r.name,
            r.writes_per_s_peak,
            r.cells,
            r.router_replicas,
            r.disk_gib_per_cell,
            r.kafka_partitions
        );
    }
}

#[cfg(test)]
mod tests;
