//! What the deployment's processes report about themselves (role, name,
//! release, address), kept in this replica's memory for `ctl upgrade
//! status` and finalize. Not replicated: each process reports to every
//! replica it knows every few seconds, so any replica's list is complete
//! within one period, and a replica of an earlier release that lacks the
//! call costs the reporter nothing but an UNIMPLEMENTED answer. Under
//! mutual TLS the certificate names the role and id, not the report.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cellmesh_proto::tls::Peer;
use cellmesh_proto::v1 as pb;
use tonic::Status;

/// A process that has not reported for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Most processes remembered (a bound on what reports can cost).
const MOST: usize = 10_000;

#[derive(Default)]
pub struct Reports {
    by_process: Mutex<BTreeMap<(String, String), (pb::ProcessReport, Instant)>>,
}

impl Reports {
    /// Records `report`, with the role and id of `peer` when the caller
    /// presented a certificate.
    pub fn record(&self, mut report: pb::ProcessReport, peer: Option<&Peer>) -> Result<(), Status> {
        if let Some(peer) = peer {
            report.role = peer.role.as_str().into();
            report.name = peer.id.clone();
        }
        if report.role.is_empty() || report.name.is_empty() || report.name.len() > 256 {
            return Err(Status::invalid_argument(
                "a process report needs a role and a name (at most 256 bytes)",
            ));
        }
        if report.version.len() > 64 || report.address.len() > 512 {
            return Err(Status::invalid_argument("process report fields too long"));
        }
        let now = Instant::now();
        let mut reports = self.by_process.lock().expect("process reports");
        let key = (report.role.clone(), report.name.clone());
        if reports.len() >= MOST && !reports.contains_key(&key) {
            // Full: forget the silent ones first (not on every report).
            reports.retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
            if reports.len() >= MOST {
                return Err(Status::resource_exhausted("too many processes reporting"));
            }
        }
        reports.insert(key, (report, now));
        Ok(())
    }

    /// The processes that reported within [`FORGET_AFTER`].
    pub fn list(&self) -> pb::ProcessList {
        let now = Instant::now();
        let reports = self.by_process.lock().expect("process reports");
        pb::ProcessList {
            processes: reports
                .values()
                .filter(|(_, at)| now.duration_since(*at) < FORGET_AFTER)
                .map(|(report, at)| pb::ReportedProcess {
                    report: Some(report.clone()),
                    age_ms: now.duration_since(*at).as_millis() as u64,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::tls::Role;

    fn report(role: &str, name: &str, version: &str) -> pb::ProcessReport {
        pb::ProcessReport {
            role: role.into(),
            name: name.into(),
            version: version.into(),
            address: String::new(),
        }
    }

    #[test]
    fn the_latest_report_of_each_process_is_listed_and_a_certificate_names_it() {
        let reports = Reports::default();
        reports.record(report("edge", "e1", "0.1.0"), None).unwrap();
        reports.record(report("edge", "e1", "0.2.0"), None).unwrap();
        // The certificate wins over what the report claims.
        let peer = Peer::new(Role::Cell, "eu-west/c1");
        reports
            .record(report("router", "pretend", "0.2.0"), Some(&peer))
            .unwrap();
        let listed: Vec<(String, String, String)> = reports
            .list()
            .processes
            .into_iter()
            .map(|p| p.report.unwrap())
            .map(|r| (r.role, r.name, r.version))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("cell".into(), "eu-west/c1".into(), "0.2.0".into()),
                ("edge".into(), "e1".into(), "0.2.0".into()),
            ]
        );
        assert!(reports.record(report("", "x", "0.2.0"), None).is_err());
        assert!(reports.record(report("edge", "", "0.2.0"), None).is_err());
    }
}
