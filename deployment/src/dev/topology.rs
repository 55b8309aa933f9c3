//! The shape of a `cellmesh dev` deployment: 3 regions, each with a router
//! replica, 2 cells and an edge, on fixed ports from a base so a restart
//! finds everything where it was; plus one fault-proxy port per
//! cross-region path (region → remote component).

pub const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];
pub const CELLS_PER_REGION: usize = 2;

/// One process Prometheus scrapes, and the labels its series get.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MetricsTarget {
    pub name: String,
    pub role: &'static str,
    pub region: String,
    /// The cell id, for cells ("" otherwise).
    pub cell: String,
    /// `host:port` of its `/metrics`.
    pub address: String,
}

#[derive(Debug, Clone)]
pub struct Topology {
    pub base: u16,
}

/// A cross-region path: traffic from `from_region` to `target` (an address)
/// goes through a proxy listening on `port`.
#[derive(Debug, Clone)]
pub struct Link {
    pub from_region: usize,
    pub to_region: usize,
    pub target: String,
    pub port: u16,
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

impl Topology {
    fn port(&self, region: usize, slot: u16) -> u16 {
        self.base + region as u16 * 20 + slot
    }
    pub fn router_api(&self, r: usize) -> String {
        url(self.port(r, 0))
    }
    pub fn router_raft(&self, r: usize) -> String {
        url(self.port(r, 1))
    }
    pub fn router_api_port(&self, r: usize) -> u16 {
        self.port(r, 0)
    }
    pub fn router_raft_port(&self, r: usize) -> u16 {
        self.port(r, 1)
    }
    pub fn cell_id(&self, r: usize, c: usize) -> String {
        format!("{}/c{}", REGIONS[r], c + 1)
    }
    pub fn cell_port(&self, r: usize, c: usize) -> u16 {
        self.port(r, 2 + c as u16)
    }
    pub fn cell(&self, r: usize, c: usize) -> String {
        url(self.cell_port(r, c))
    }
    pub fn edge_port(&self, r: usize) -> u16 {
        self.port(r, 9)
    }
    pub fn edge(&self, r: usize) -> String {
        url(self.edge_port(r))
    }
    pub fn etcd_ports(&self) -> (u16, u16) {
        (self.base + 90, self.base + 91)
    }
    /// Control-plane replica `i`'s web console.
    pub fn console_port(&self, i: usize) -> u16 {
        self.base + 92 + i as u16
    }
    /// Control-plane replica `i`'s admin API.
    pub fn admin_port(&self, i: usize) -> u16 {
        self.base + 94 + i as u16
    }

    /// Control-plane replica `i`'s `/metrics`.
    pub fn control_plane_metrics_port(&self, i: usize) -> u16 {
        self.base + 96 + i as u16
    }
    /// The Prometheus of `cellmesh dev --prometheus`.
    pub fn prometheus_port(&self) -> u16 {
        self.base + 98
    }
    /// The embedded trace receiver: OTLP/gRPC, and its query API.
    pub fn trace_ports(&self) -> (u16, u16) {
        (self.port(0, 16), self.port(0, 17))
    }
    pub fn router_metrics_port(&self, r: usize) -> u16 {
        self.port(r, 10)
    }
    pub fn cell_metrics_port(&self, r: usize, c: usize) -> u16 {
        self.port(r, 11 + c as u16)
    }
    /// Where cell `c` of region `r` serves its signed file URLs.
    pub fn cell_files_port(&self, r: usize, c: usize) -> u16 {
        self.port(r, 18 + c as u16)
    }
    pub fn edge_metrics_port(&self, r: usize) -> u16 {
        self.port(r, 15)
    }

    /// Every process's `/metrics` address with its target labels, the
    /// control-plane replicas (`control_planes` of them) included.
    pub fn metrics_targets(&self, control_planes: usize) -> Vec<MetricsTarget> {
        let target = |name: String, role, region: &str, port, cell: &str| MetricsTarget {
            name,
            role,
            region: region.to_string(),
            cell: cell.to_string(),
            address: format!("127.0.0.1:{port}"),
        };
        let mut targets = Vec::new();
        for (r, region) in REGIONS.iter().enumerate() {
            let router = self.router_metrics_port(r);
            targets.push(target(
                format!("router-{region}"),
                "router",
                region,
                router,
                "",
            ));
            for c in 0..CELLS_PER_REGION {
                let id = self.cell_id(r, c);
                let port = self.cell_metrics_port(r, c);
                targets.push(target(id.replace('/', "-"), "cell", region, port, &id));
            }
            let edge = self.edge_metrics_port(r);
            targets.push(target(format!("edge-{region}"), "edge", region, edge, ""));
        }
        for i in 0..control_planes {
            let port = self.control_plane_metrics_port(i);
            let name = format!("control-plane-{}", i + 1);
            targets.push(target(name, "control-plane", REGIONS[0], port, ""));
        }
        targets
    }

    /// Every cross-region path with its proxy port.
    pub fn links(&self) -> Vec<Link> {
        let mut links = Vec::new();
        let mut port = self.base + 100;
        for from in 0..REGIONS.len() {
            for to in (0..REGIONS.len()).filter(|t| *t != from) {
                let mut targets = vec![self.router_api(to), self.router_raft(to)];
                targets.extend((0..CELLS_PER_REGION).map(|c| self.cell(to, c)));
                for target in targets {
                    links.push(Link {
                        from_region: from,
                        to_region: to,
                        target,
                        port,
                    });
                    port += 1;
                }
            }
        }
        links
    }

    /// target → proxy address, for components of `region`.
    pub fn links_from(&self, region: usize) -> std::collections::BTreeMap<String, String> {
        self.links()
            .into_iter()
            .filter(|l| l.from_region == region)
            .map(|l| (l.target, url(l.port)))
            .collect()
    }

    /// The routers as seen from `region`: its own first, others via links.
    pub fn routers_from(&self, region: usize) -> Vec<String> {
        let links = self.links_from(region);
        let mut out = vec![self.router_api(region)];
        for r in (0..REGIONS.len()).filter(|r| *r != region) {
            let api = self.router_api(r);
            out.push(links.get(&api).cloned().unwrap_or(api));
        }
        out
    }
}
