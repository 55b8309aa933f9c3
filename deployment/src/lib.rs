//! Deployments of cellmesh: `cellmesh dev`, a whole three-region
//! deployment on one machine as supervised processes of the binary (its
//! topology and ports, the supervisor, the fault proxies on every
//! cross-region path, the demo tenant, the optional mock Kafka cluster).
//! Tools reach a running one through `cellmesh_chaos::target::DevTarget`.

pub mod dev;
