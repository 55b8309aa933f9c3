//! The `ctl` commands that move many routes at once through live
//! migrations: a whole tenant, draining a cell (everything it owns to
//! another cell), and failing back what a failover took from a cell once it
//! has returned. Each runs in this process and can be run again to resume;
//! its state is in the route table.

use std::time::Instant;

use cellmesh_control_plane::migration::bulk::{BulkEvent, BulkReport};
use cellmesh_control_plane::migration::tenant::TenantProgress;
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use serde_json::json;

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Prints the move's progress at most every 10% of a round, and at each
/// phase: items in step, rows copied, lag, rate, ETA, freeze.
fn tenant_progress(tenant: u64) -> impl FnMut(&TenantProgress) {
    let (mut shown, mut phase, mut files_shown) = (0, "", None);
    move |p| {
        let items = p.conversations + p.users_moved;
        let pct = (p.moved * 100).checked_div(items).unwrap_or(100).min(100);
        if p.phase == "files" {
            if files_shown == Some(p.file_bytes_copied) {
                return;
            }
            files_shown = Some(p.file_bytes_copied);
            println!(
                "tenant {tenant} files      {}/{} files, {} of {} in the target's region",
                p.files_copied,
                p.files_total,
                megabytes(p.file_bytes_copied),
                megabytes(p.file_bytes_total)
            );
        } else if p.moved == 0 || pct >= shown + 10 || p.phase != phase {
            (shown, phase) = (pct, p.phase);
            let bar = "#".repeat(pct as usize / 5) + &".".repeat(20 - pct as usize / 5);
            let per_s = p.rate();
            let eta = p
                .eta()
                .map_or_else(|| "-".into(), |d| format!("{:.0} s", d.as_secs_f64()));
            println!(
                "tenant {tenant} {:<10} [{bar}] {}/{} items ({} conversations, {} homes), {} rows / {} copied ({per_s:.0} rows/s), lag {}, ETA {eta}, frozen {} ms",
                p.phase,
                p.moved,
                items,
                p.conversations,
                p.users_moved,
                p.messages,
                megabytes(p.bytes),
                p.lag,
                p.max_freeze.as_millis()
            );
        }
    }
}

pub async fn migrate_tenant(
    routes: RouteClient,
    secret: ClusterSecret,
    tenant: u64,
    to: &str,
    (parallel, rate, file_rate): (usize, u64, u64),
    json: bool,
) -> anyhow::Result<()> {
    let options = MigrationOptions {
        rate,
        file_rate,
        ..MigrationOptions::default()
    };
    let migrator = Migrator::new(routes, secret, options);
    let report = migrator
        .migrate_tenant(TenantId(tenant), to, parallel, tenant_progress(tenant))
        .await?;
    if json {
        println!(
            "{}",
            json!({"tenant": tenant, "from": report.from, "to": report.to,
                "conversations_moved": report.conversations_moved,
                "messages_moved": report.messages_moved,
                "bytes_moved": report.bytes_moved,
                "users_moved": report.users_moved,
                "max_freeze_ms": report.max_freeze.as_millis() as u64,
                "overrides_removed": report.overrides_removed,
                "route_writes": report.route_writes,
                "total_ms": report.total.as_millis() as u64,
                "switch_epoch": report.switch_epoch,
                "files_copied": report.files.files,
                "file_bytes_copied": report.files.bytes,
                "files_pending": report.files.files_pending})
        );
    } else {
        println!(
            "tenant {tenant} moved {} -> {}: {} conversations, {} messages and events copied ({}), {} user homes, frozen {} ms, {} route writes, {} files ({}) copied into its region ({} still copying), total {} ms",
            report.from,
            report.to,
            report.conversations_moved,
            report.messages_moved,
            megabytes(report.bytes_moved),
            report.users_moved,
            report.max_freeze.as_millis(),
            report.route_writes,
            report.files.files,
            megabytes(report.files.bytes),
            report.files.files_pending,
            report.total.as_millis()
        );
    }
    Ok(())
}

/// `ctl migrate user`: moves one user's home (sync queue, conversation
/// list, mute flags, device cursors).
pub async fn migrate_user(
    routes: RouteClient,
    secret: ClusterSecret,
    tenant: u64,
    user: u64,
    to: &str,
    json: bool,
) -> anyhow::Result<()> {
    let migrator = Migrator::new(routes, secret, MigrationOptions::default());
    let report = migrator
        .migrate_user(TenantId(tenant), UserId(user), to, |p| {
            if !json {
                println!(
                    "user {user} {:<9} pts {}/{}",
                    p.phase, p.copied_through, p.source_latest
                );
            }
        })
        .await?;
    if json {
        println!(
            "{}",
            json!({"tenant": tenant, "user": user, "from": report.from, "to": report.to,
                "final_pts": report.final_pts, "events_verified": report.events_verified,
                "frozen_ms": report.frozen_for.as_millis() as u64,
                "total_ms": report.total.as_millis() as u64,
                "switch_epoch": report.switch_epoch})
        );
    } else {
        println!(
            "user {user} of tenant {tenant} moved {} -> {}: {} sync events verified, frozen {} ms, total {} ms",
            report.from,
            report.to,
            report.events_verified,
            report.frozen_for.as_millis(),
            report.total.as_millis()
        );
    }
    Ok(())
}

/// Prints what a drain or failback does, and fails if anything stayed.
fn finish(what: &str, started: Instant, report: &BulkReport) -> anyhow::Result<()> {
    anyhow::ensure!(
        report.failures.is_empty(),
        "{} routes did not move; run the {what} again to resume",
        report.failures.len()
    );
    println!(
        "{what} into {} done in {} ms: {} tenants, {} conversation overrides and {} user homes; {} conversations moved",
        report.to,
        started.elapsed().as_millis(),
        report.selection.tenants.len(),
        report.selection.conversations.len(),
        report.selection.users.len(),
        report.conversations_moved
    );
    Ok(())
}

fn show() -> impl FnMut(BulkEvent<'_>) {
    let mut tenants = std::collections::HashMap::new();
    move |event| match event {
        BulkEvent::Tenant(tenant, p) => tenants
            .entry(tenant)
            .or_insert_with(|| tenant_progress(tenant))(p),
        BulkEvent::Moved(key) => println!("{key}: moved"),
        BulkEvent::Failed(key, e) => eprintln!("{key}: {e}"),
    }
}

/// `ctl drain CELL`.
pub async fn drain(
    routes: RouteClient,
    secret: ClusterSecret,
    cell: &str,
    to: Option<String>,
    parallel: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    println!("{cell}: Draining (no new placements); moving what it owns");
    let report = Migrator::new(routes, secret, MigrationOptions::default())
        .drain(cell, to.as_deref(), parallel, show())
        .await?;
    finish("drain", started, &report)
}

/// `ctl failback CELL`.
pub async fn failback(
    routes: RouteClient,
    secret: ClusterSecret,
    cell: &str,
    parallel: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let report = Migrator::new(routes, secret, MigrationOptions::default())
        .failback(cell, parallel, show())
        .await?;
    finish("failback", started, &report)
}

/// `ctl migrate conversation`: one conversation's live move, with a
/// progress bar per copy round.
pub(super) async fn migrate_conversation(
    routes: RouteClient,
    secret: ClusterSecret,
    (tenant, conversation, to): (TenantId, ConversationId, &str),
    options: MigrationOptions,
) -> anyhow::Result<()> {
    let migrator = Migrator::new(routes, secret, options);
    let report = migrator
        .migrate_conversation(tenant, conversation, to, |p| {
            let pct = (p.copied_through * 100)
                .checked_div(p.source_latest)
                .unwrap_or(100)
                .min(100);
            let bar = "#".repeat(pct as usize / 5) + &".".repeat(20 - pct as usize / 5);
            println!(
                "{:<9} [{bar}] {}/{}",
                p.phase, p.copied_through, p.source_latest
            );
        })
        .await?;
    println!(
        "conversation {conversation} moved {} -> {}: {} messages verified, seq continues above {}, writes paused {} ms, total {} ms",
        report.from,
        report.to,
        report.messages_verified,
        report.final_seq,
        report.frozen_for.as_millis(),
        report.total.as_millis()
    );
    Ok(())
}
