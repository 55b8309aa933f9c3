use super::*;
use cellmesh_proto::ids::TenantId;
use cellmesh_route_client::table::{CellStatus, RouteState};

const ME: &str = "us-east/c2";
const FAILED: &str = "us-east/c1";

fn key() -> Key {
    Key::tenant(TenantId(7))
}

fn route(cell: &str, epoch: u64, failed_over: bool) -> Change {
    Change::Route(Entry {
        key: key(),
        cell: cell.into(),
        epoch,
        state: RouteState::Active,
        seq_floor: 0,
        floor_margin: if failed_over { 8_000 } else { 0 },
        failed_from: failed_over.then(|| FAILED.to_string()),
        regions: Vec::new(),
    })
}

fn cell(status: CellStatus, version: &str) -> Change {
    Change::Cell(CellInfo {
        id: FAILED.into(),
        region: "us-east".into(),
        address: "127.0.0.1:1".into(),
        status,
        epoch: 1,
        mark_holders: vec![ME.into()],
        version: version.into(),
        owner_lease_ms: 1_500,
    })
}

fn entry(change: &Change) -> &Entry {
    match change {
        Change::Route(e) => e,
        _ => unreachable!(),
    }
}

/// A state that saw the route on the failed cell, then `events` at the
/// given offsets; from when the failed-over route may count its wait.
fn since(events: &[(u64, Change)], known: bool) -> (Instant, Instant) {
    let t0 = Instant::now();
    let mut state = State::default();
    state.apply(ME, &[route(FAILED, 5, false)], t0, known);
    for (at, change) in events {
        let at = t0 + Duration::from_millis(*at);
        state.apply(ME, std::slice::from_ref(change), at, known);
    }
    let switch = entry(&events.last().expect("the switch").1).clone();
    (t0, state.safe_since(&switch, t0 + Duration::from_secs(10)))
}

#[test]
fn without_a_fence_the_wait_counts_from_the_switch() {
    let (t0, since) = since(&[(2_000, route(ME, 9, true))], true);
    assert_eq!(since, t0 + Duration::from_millis(2_000));
}

#[test]
fn a_predecessor_fenced_before_the_switch_counts_from_its_fence() {
    let events = [
        (300, cell(CellStatus::Degraded, "0.3.0")),
        // Degraded, then Down: fenced without a break.
        (1_900, cell(CellStatus::Down, "0.3.0")),
        (2_000, route(ME, 9, true)),
    ];
    let (t0, since) = since(&events, true);
    assert_eq!(since, t0 + Duration::from_millis(300));
}

#[test]
fn a_fence_is_trusted_only_of_a_release_that_honours_it_and_without_a_break() {
    let older = [
        (300, cell(CellStatus::Degraded, "0.2.0")),
        (2_000, route(ME, 9, true)),
    ];
    let (t0, since_older) = since(&older, true);
    assert_eq!(since_older, t0 + Duration::from_millis(2_000));
    let lifted = [
        (300, cell(CellStatus::Degraded, "0.3.0")),
        (800, cell(CellStatus::Up, "0.3.0")),
        (1_200, cell(CellStatus::Degraded, "0.3.0")),
        (2_000, route(ME, 9, true)),
    ];
    let (t0, since_lifted) = since(&lifted, true);
    assert_eq!(since_lifted, t0 + Duration::from_millis(1_200));
}

#[test]
fn an_unknown_predecessor_counts_from_the_switch() {
    let events = [
        (300, cell(CellStatus::Degraded, "0.3.0")),
        (2_000, route(ME, 9, true)),
    ];
    // Seen from a snapshot, not as changes: the owner before is unknown.
    let (t0, since) = since(&events, false);
    assert_eq!(since, t0 + Duration::from_millis(2_000));
}

#[test]
fn a_fence_lifted_after_it_proved_the_wait_over_does_not_undo_it() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut state = State::default();
    state.apply(ME, &[route(FAILED, 5, false)], t0, true);
    state.apply(ME, &[cell(CellStatus::Degraded, "0.3.0")], at(300), true);
    let switch = route(ME, 9, true);
    state.apply(ME, std::slice::from_ref(&switch), at(2_000), true);
    assert_eq!(state.safe_since(entry(&switch), at(2_100)), at(300));
    // The failed cell comes back: Up again.
    state.apply(ME, &[cell(CellStatus::Up, "0.3.0")], at(3_000), true);
    assert_eq!(state.safe_since(entry(&switch), at(3_100)), at(300));
}
