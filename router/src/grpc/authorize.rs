//! What each caller may change in the route table, by the identity its
//! certificate names (with mutual TLS on; without it, every holder of the
//! deployment secret may do everything). The control plane and operators
//! change anything; a router forwards to the leader only what it checked
//! itself; a cell registers only itself, records only its own mark
//! holders and places new conversations only on itself; an edge only
//! reads. Raft messages are taken only from the router the message names.

use cellmesh_proto::tls::{Peer, Role, denied};
use cellmesh_proto::v1::{self as pb, route_command::Command, update_route::Transition};
use tonic::Status;

/// Whether `peer` may apply `command`.
pub fn may_apply(peer: &Peer, command: &pb::RouteCommand) -> Result<(), Status> {
    let own = |cell: &str| cell == peer.id;
    let allowed = match peer.role {
        Role::ControlPlane | Role::Operator | Role::Router => true,
        Role::Edge => false,
        Role::Cell => match &command.command {
            Some(Command::RegisterCell(r)) => own(&r.cell_id),
            Some(Command::SetMarkHolders(m)) => own(&m.cell_id),
            Some(Command::UpdateRoute(u)) => {
                matches!(&u.transition, Some(Transition::Place(cell)) if own(cell))
            }
            _ => false,
        },
    };
    if allowed {
        Ok(())
    } else {
        Err(denied(format!(
            "{peer} may not apply this change to the route table"
        )))
    }
}

/// Whether `peer` may change the router group's membership.
pub fn may_change_membership(peer: &Peer) -> Result<(), Status> {
    match peer.role {
        Role::ControlPlane | Role::Operator | Role::Router => Ok(()),
        _ => Err(denied(format!(
            "{peer} may not change the router group's membership"
        ))),
    }
}

/// Whether a Raft message claiming to come from node `from` comes from it.
pub fn is_router(peer: Option<&Peer>, from: u64) -> Result<(), Status> {
    match peer {
        None => Ok(()),
        Some(p) if p.role == Role::Router && p.id == from.to_string() => Ok(()),
        Some(p) => Err(denied(format!("{p} may not speak for router node {from}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(cell: &str) -> pb::RouteCommand {
        pb::RouteCommand {
            command: Some(Command::RegisterCell(pb::RegisterCell {
                cell_id: cell.into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_cell_registers_only_itself_and_an_edge_nothing() {
        let c1 = Peer::new(Role::Cell, "eu-west/c1");
        assert!(may_apply(&c1, &register("eu-west/c1")).is_ok());
        assert!(may_apply(&c1, &register("eu-west/c2")).is_err());
        let edge = Peer::new(Role::Edge, "eu-west");
        assert!(may_apply(&edge, &register("eu-west/c1")).is_err());
        let cp = Peer::new(Role::ControlPlane, "1");
        assert!(may_apply(&cp, &register("eu-west/c2")).is_ok());
        assert!(may_change_membership(&c1).is_err());
        assert!(is_router(Some(&Peer::new(Role::Router, "2")), 2).is_ok());
        assert!(is_router(Some(&Peer::new(Role::Router, "2")), 3).is_err());
        assert!(is_router(Some(&c1), 2).is_err());
    }
}
