//! `cellmesh pki issue-all`: every certificate a Terraform deployment
//! needs, read from its variables file (`terraform.tfvars.json`, the
//! format `cellmesh plan --tfvars` writes). The identities are the ones
//! `terraform/` gives its nodes: routers `1..=N` over all regions, cells
//! `<region>/c<k>`, one edge per region named by the region, the control
//! plane's replicas `1..=M` — and `operator/admin` for the operator's
//! tools, which stays here — and a server certificate for each etcd member
//! (`etcd-<n>`, naming its host `etcd-<n>.<primary_region>.<internal_domain>`).
//! Terraform then reads the files
//! (`tls_dir`) into one secret per node; a certificate missing there
//! fails its plan and names this command.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use cellmesh_proto::tls::{Peer, Role};
use serde::Deserialize;

/// The control plane's replicas when the variables do not say
/// (`control_plane_replicas` in terraform/envs/example).
const CONTROL_PLANE_REPLICAS: u32 = 2;

/// etcd members in `primary_region` (terraform/modules/etcd).
const ETCD_MEMBERS: u32 = 3;

/// The part of the example env's variables that names nodes.
#[derive(Debug, Deserialize)]
struct Variables {
    regions: BTreeMap<String, RegionVars>,
    #[serde(default)]
    control_plane_replicas: Option<u32>,
    #[serde(default = "primary_region")]
    primary_region: String,
    #[serde(default = "internal_domain")]
    internal_domain: String,
}

fn primary_region() -> String {
    "eu-west-1".into()
}

fn internal_domain() -> String {
    "cellmesh.internal".into()
}

#[derive(Debug, Deserialize)]
struct RegionVars {
    cells: u32,
    router_replicas: u32,
}

/// The variables in `text`.
fn variables(text: &str) -> anyhow::Result<Variables> {
    let vars: Variables = serde_json::from_str(text).context(
        "not the JSON variables of terraform/envs/example (write them as terraform.tfvars.json; `cellmesh plan --tfvars` does)",
    )?;
    if vars.regions.is_empty() {
        bail!("regions: name at least one region");
    }
    Ok(vars)
}

/// Every node identity `vars` call for, in a stable order.
fn nodes(vars: &Variables) -> Vec<Peer> {
    let routers: u32 = vars.regions.values().map(|r| r.router_replicas).sum();
    let control_planes = vars
        .control_plane_replicas
        .unwrap_or(CONTROL_PLANE_REPLICAS);
    let mut peers: Vec<Peer> = (1..=routers)
        .map(|n| Peer::new(Role::Router, &n.to_string()))
        .collect();
    for (region, spec) in &vars.regions {
        peers.extend((1..=spec.cells).map(|c| Peer::new(Role::Cell, &format!("{region}/c{c}"))));
        peers.push(Peer::new(Role::Edge, region));
    }
    peers.extend((1..=control_planes).map(|n| Peer::new(Role::ControlPlane, &n.to_string())));
    peers.push(Peer::new(Role::Operator, "admin"));
    peers
}

/// The etcd members' certificate stems and host names.
fn etcd_members(vars: &Variables) -> Vec<(String, String)> {
    (1..=ETCD_MEMBERS)
        .map(|n| {
            let host = format!("etcd-{n}.{}.{}", vars.primary_region, vars.internal_domain);
            (format!("etcd-{n}"), host)
        })
        .collect()
}

/// A certificate to issue: a node's, or an etcd member's (named by host).
enum Subject {
    Node(Peer),
    Etcd { stem: String, host: String },
}

impl Subject {
    fn stem(&self) -> String {
        match self {
            Self::Node(peer) => super::pki::Pki::stem(peer),
            Self::Etcd { stem, .. } => stem.clone(),
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(peer) => write!(f, "{peer}"),
            Self::Etcd { host, .. } => write!(f, "etcd member {host}"),
        }
    }
}

/// Issues what `tfvars` calls for into the CA's folder: only the
/// certificates missing there, or all of them with `renew`. Returns how
/// many were issued and how many were kept.
pub fn issue_all(
    pki: &super::pki::Pki,
    tfvars: &Path,
    renew: bool,
) -> anyhow::Result<(usize, usize)> {
    let text = std::fs::read_to_string(tfvars)
        .with_context(|| format!("cannot read {}", tfvars.display()))?;
    let vars = variables(&text).with_context(|| tfvars.display().to_string())?;
    let subjects = (nodes(&vars).into_iter().map(Subject::Node))
        .chain((etcd_members(&vars).into_iter()).map(|(stem, host)| Subject::Etcd { stem, host }));
    let (mut issued, mut kept) = (0, 0);
    for subject in subjects {
        if !renew && pki.holds(&subject.stem()) {
            kept += 1;
            continue;
        }
        let files = match &subject {
            Subject::Node(peer) => pki.issue(peer)?,
            Subject::Etcd { stem, host } => pki.issue_server(stem, std::slice::from_ref(host))?,
        };
        println!("issued {subject}: {}", files.cert_file);
        issued += 1;
    }
    Ok((issued, kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identities_follow_terraforms_names() {
        let text = r#"{"regions": {"us-east-1": {"cells": 1, "router_replicas": 1},
            "eu-west-1": {"cells": 2, "router_replicas": 2, "data_volume_gib": 50}},
            "kafka": true}"#;
        let uris: Vec<String> = nodes(&variables(text).unwrap())
            .iter()
            .map(Peer::uri)
            .collect();
        assert_eq!(
            uris,
            [
                "cellmesh:router/1",
                "cellmesh:router/2",
                "cellmesh:router/3",
                "cellmesh:cell/eu-west-1/c1",
                "cellmesh:cell/eu-west-1/c2",
                "cellmesh:edge/eu-west-1",
                "cellmesh:cell/us-east-1/c1",
                "cellmesh:edge/us-east-1",
                "cellmesh:control-plane/1",
                "cellmesh:control-plane/2",
                "cellmesh:operator/admin",
            ]
        );
        let three = r#"{"regions": {"eu-west-1": {"cells": 1, "router_replicas": 3}},
            "control_plane_replicas": 3}"#;
        assert_eq!(
            nodes(&variables(three).unwrap())
                .iter()
                .filter(|p| p.role == Role::ControlPlane)
                .count(),
            3
        );
    }

    #[test]
    fn etcd_members_are_named_by_the_primary_region_and_internal_domain() {
        let text = r#"{"regions": {"us-east-1": {"cells": 1, "router_replicas": 3}},
            "primary_region": "us-east-1", "internal_domain": "corp.internal"}"#;
        let members = etcd_members(&variables(text).unwrap());
        assert_eq!(members.len(), 3);
        assert_eq!(
            members[2],
            ("etcd-3".into(), "etcd-3.us-east-1.corp.internal".into())
        );
        let default = etcd_members(
            &variables(r#"{"regions": {"eu-west-1": {"cells": 1, "router_replicas": 3}}}"#)
                .unwrap(),
        );
        assert_eq!(default[0].1, "etcd-1.eu-west-1.cellmesh.internal");
    }

    #[test]
    fn hcl_and_missing_regions_are_refused_with_the_reason() {
        let hcl = variables("regions = { \"eu-west-1\" = { cells = 1 } }").unwrap_err();
        assert!(
            format!("{hcl:#}").contains("terraform.tfvars.json"),
            "{hcl:#}"
        );
        let none = variables(r#"{"regions": {}}"#).unwrap_err();
        assert!(none.to_string().contains("at least one region"), "{none}");
        let missing = variables(r#"{"regions": {"eu-west-1": {"cells": 1}}}"#).unwrap_err();
        assert!(
            format!("{missing:#}").contains("router_replicas"),
            "{missing:#}"
        );
    }

    #[test]
    fn issuing_again_keeps_what_exists_unless_renewing() {
        let dir = tempfile::tempdir().unwrap();
        let pki = super::super::pki::Pki::create(dir.path()).unwrap();
        let vars = dir.path().join("terraform.tfvars.json");
        std::fs::write(
            &vars,
            r#"{"regions": {"eu-west-1": {"cells": 1, "router_replicas": 3}}}"#,
        )
        .unwrap();
        assert_eq!(issue_all(&pki, &vars, false).unwrap(), (11, 0));
        let cell = dir.path().join("cell-eu-west-1-c1.pem");
        let first = std::fs::read(&cell).unwrap();
        assert_eq!(issue_all(&pki, &vars, false).unwrap(), (0, 11));
        assert_eq!(std::fs::read(&cell).unwrap(), first);
        assert_eq!(issue_all(&pki, &vars, true).unwrap(), (11, 0));
        assert_ne!(std::fs::read(&cell).unwrap(), first);
    }
}
