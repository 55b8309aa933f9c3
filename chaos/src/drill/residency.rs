//! `--pin-regions`: the drill tenant bound to regions for the drill (its
//! moves then stay inside them), and at the end an audit of every cell
//! outside them: no row of its store and no cold segment may hold a byte
//! of the drill's messages or conversation titles (their run's tags, which
//! no other run writes). At least one cell inside must hold them, or the
//! audit proves nothing. The binding is lifted afterwards.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::v1::AuditRequest;
use cellmesh_route_client::peers::Peers;
use serde_json::{Value, json};

use crate::target::DevTarget;

/// Binds the drill tenant to `regions`, if any.
pub(super) async fn pin(dev: &DevTarget, regions: &[String]) -> anyhow::Result<()> {
    if regions.is_empty() {
        return Ok(());
    }
    bind(dev, TenantId(dev.tenant), regions).await?;
    println!("tenant {} bound to {}", dev.tenant, regions.join(","));
    Ok(())
}

/// With `regions`, the audit of every cell for `tags` (see [`audit`]);
/// then the drill tenant is unbound.
pub(super) async fn audit_and_unpin(
    dev: &DevTarget,
    regions: &[String],
    tags: &[String],
) -> anyhow::Result<Option<Value>> {
    if regions.is_empty() {
        return Ok(None);
    }
    let found = audit(dev, TenantId(dev.tenant), regions, tags).await?;
    bind(dev, TenantId(dev.tenant), &[]).await?;
    Ok(Some(found))
}

/// Binds `tenant` to `regions` (an empty list lifts the binding).
async fn bind(dev: &DevTarget, tenant: TenantId, regions: &[String]) -> anyhow::Result<()> {
    (dev.routes().await?)
        .bind_regions(tenant, regions)
        .await
        .map_err(|e| anyhow::anyhow!("binding tenant {tenant} to {regions:?}: {}", e.message()))
}

/// Asks every cell whether it holds `needles` or cold segments of
/// `tenant`; the findings, `holds` saying whether the audit passed.
async fn audit(
    dev: &DevTarget,
    tenant: TenantId,
    regions: &[String],
    needles: &[String],
) -> anyhow::Result<Value> {
    let routes = dev.routes().await?;
    let cells: Vec<(String, String, String)> = routes.read(|t| {
        t.cells
            .values()
            .map(|c| (c.id.clone(), c.region.clone(), c.address.clone()))
            .collect()
    });
    let (peers, secret) = (Peers::default(), dev.secret());
    let (mut outside, mut inside_rows, mut findings) = (0u64, 0u64, Vec::new());
    for (cell, region, address) in cells {
        let mut request = tonic::Request::new(AuditRequest {
            tenant_id: tenant.get(),
            needles: needles.iter().map(|n| n.as_bytes().to_vec()).collect(),
        });
        secret.attach(&mut request);
        let answer = peers
            .backups(&address)?
            .audit(request)
            .await
            .map_err(|e| anyhow::anyhow!("audit of {cell}: {}", e.message()))?
            .into_inner();
        let rows: Vec<(String, u64)> = (answer.rows.into_iter())
            .map(|r| (r.column_family, r.rows))
            .collect();
        let cold = answer.cold_segments;
        let held: u64 = rows.iter().map(|(_, n)| n).sum::<u64>() + cold;
        let pinned = regions.contains(&region);
        match pinned {
            true => inside_rows += held,
            false => outside += held,
        }
        if held > 0 {
            println!(
                "  residency audit: {cell} ({}) holds {rows:?} and {cold} cold segments",
                if pinned { "inside" } else { "OUTSIDE" }
            );
        }
        findings.push(json!({"cell": cell, "region": region, "inside": pinned,
            "rows": rows.iter().map(|(cf, n)| json!({"column_family": cf, "rows": n})).collect::<Vec<_>>(),
            "cold_segments": cold}));
    }
    let passed = outside == 0 && inside_rows > 0;
    println!(
        "  residency audit of tenant {tenant} (regions {}): {outside} rows outside, {inside_rows} inside{}",
        regions.join(","),
        if inside_rows == 0 {
            " (nothing found inside: the audit proves nothing)"
        } else {
            ""
        }
    );
    Ok(
        json!({"regions": regions, "outside": outside, "inside": inside_rows,
        "cells": findings, "holds": passed}),
    )
}
