//! Releases: the version this build is ([`BINARY`]), how versions compare,
//! and the cluster version's gates. A release runs beside the one before
//! it in every role; what it writes differently (records, queue events,
//! route commands) waits until the route table's cluster version reaches
//! the release that introduced it — `ctl upgrade finalize` raises it once
//! every process runs that release. An empty cluster version is a
//! deployment older than the first release that kept one.

use std::fmt;

/// The release of this build.
pub const BINARY: &str = env!("CARGO_PKG_VERSION");

/// The response header in which every internal server (cells, routers, the
/// control plane; health checks included) names its release.
pub const HEADER: &str = "x-cellmesh-version";

/// The first release with a cluster version: before finalize, a
/// deployment upgraded from an earlier build reads as this one's
/// predecessor.
pub const FIRST: Version = Version::new(0, 2, 0);

/// Reading cells' embedded event queues in the outbox itself (no copy into
/// a queue column family): the releases before could not read a store
/// whose outbox was consumed that way.
pub const OUTBOX_QUEUE: Version = Version::new(0, 2, 0);

/// Backup operations in the control plane's operation records: the
/// releases before cannot read a record of that kind.
pub const BACKUP_OPERATIONS: Version = Version::new(0, 3, 0);

/// Tenants bound to regions (`SetTenantRegions`, `RouteEntry.regions`):
/// the releases before cannot decode that route command.
pub const RESIDENCY: Version = Version::new(0, 3, 0);

/// Fenced leases: a cell the route table marks Degraded or Down renews no
/// owner lease, so one lease after the mark it has stopped writing. A
/// failover's new owner trusts the mark of a cell of this release or
/// later; a cell of a release before may go on renewing.
pub const FENCED_LEASE: Version = Version::new(0, 3, 0);

/// `MAJOR.MINOR.PATCH`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// This build's release.
    pub fn binary() -> Self {
        Self::parse(BINARY).expect("the crate version is MAJOR.MINOR.PATCH")
    }

    /// Parses `MAJOR.MINOR.PATCH` (a pre-release or build suffix after `-`
    /// or `+` is ignored).
    pub fn parse(text: &str) -> Result<Self, String> {
        let core = text.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        let [major, minor, patch] = parts[..] else {
            return Err(format!("{text:?} is not MAJOR.MINOR.PATCH"));
        };
        let number = |p: &str| {
            p.parse::<u32>()
                .map_err(|_| format!("{text:?} is not MAJOR.MINOR.PATCH"))
        };
        Ok(Self::new(number(major)?, number(minor)?, number(patch)?))
    }

    /// A reported version: "" (a build before versions were reported) is
    /// older than every release.
    pub fn reported(text: &str) -> Option<Self> {
        Self::parse(text).ok()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Whether a deployment at cluster version `cluster` ("" = before the
/// first release that kept one) may use what `gate` introduced.
pub fn enabled(cluster: &str, gate: Version) -> bool {
    Version::reported(cluster).is_some_and(|c| c >= gate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order_numerically() {
        assert_eq!(Version::parse("0.10.2").unwrap(), Version::new(0, 10, 2));
        assert!(Version::parse("0.10.0").unwrap() > Version::parse("0.9.9").unwrap());
        assert_eq!(Version::parse("1.2.3-rc.1").unwrap(), Version::new(1, 2, 3));
        for bad in ["", "1", "1.2", "1.2.x", "1.2.3.4", "a.b.c"] {
            assert!(Version::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Version::binary().to_string(), BINARY);
    }

    #[test]
    fn a_gate_opens_at_its_release_and_never_before() {
        assert!(!enabled("", OUTBOX_QUEUE), "an unversioned deployment");
        assert!(!enabled("0.1.9", Version::new(0, 2, 0)));
        assert!(enabled("0.2.0", Version::new(0, 2, 0)));
        assert!(enabled("0.3.1", Version::new(0, 2, 0)));
    }
}
