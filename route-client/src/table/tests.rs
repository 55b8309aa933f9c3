use super::*;
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};

fn table_with_cells() -> (RouteTable, u64) {
    let mut t = RouteTable::default();
    for (i, id) in ["eu/c1", "eu/c2", "us/c1"].iter().enumerate() {
        let region = id.split('/').next().unwrap().to_string();
        t.apply(
            &Command::RegisterCell {
                id: id.to_string(),
                region,
                address: format!("http://127.0.0.1:{}", 7000 + i),
                version: "0.2.0".into(),
                owner_lease_ms: 0,
            },
            i as u64 + 1,
        )
        .unwrap();
    }
    (t, 4)
}

/// Places a new tenant (the write must succeed).
fn place(t: &mut RouteTable, tenant: u64, cell: &str, index: u64) {
    t.apply(
        &Command::AssignTenant {
            tenant,
            cell: cell.into(),
            expect_epoch: 0,
        },
        index,
    )
    .unwrap();
}

fn update(
    t: &mut RouteTable,
    index: u64,
    key: Key,
    expect: u64,
    tr: Transition,
) -> Result<Vec<Change>, RouteError> {
    t.apply(
        &Command::UpdateRoute {
            key,
            expect_epoch: expect,
            transition: tr,
        },
        index,
    )
}

#[test]
fn tenant_placement_and_overrides_resolve() {
    let (mut t, i) = table_with_cells();
    place(&mut t, 7, "eu/c1", i);
    let conv = Key::conversation(TenantId(7), ConversationId(100));
    let r = t.resolve(&conv).unwrap();
    assert_eq!((r.entry.cell.as_str(), r.entry.epoch), ("eu/c1", i));
    assert_eq!(r.cell_address, "http://127.0.0.1:7000");
    // A second placement of the same tenant must name its epoch.
    let again = t.apply(
        &Command::AssignTenant {
            tenant: 7,
            cell: "eu/c2".into(),
            expect_epoch: 0,
        },
        i + 1,
    );
    assert!(matches!(again, Err(RouteError::StaleEpoch { current, .. }) if current == i));
    // Failing one conversation over creates an override; others stay.
    update(
        &mut t,
        i + 2,
        conv,
        i,
        Transition::Failover {
            to: "us/c1".into(),
            seq_floor: 0,
            floor_margin: 0,
        },
    )
    .unwrap();
    assert_eq!(t.resolve(&conv).unwrap().entry.cell, "us/c1");
    assert_eq!(
        t.resolve(&Key::conversation(TenantId(7), ConversationId(101)))
            .unwrap()
            .entry
            .cell,
        "eu/c1"
    );
    assert!(
        t.resolve(&Key::conversation(TenantId(8), ConversationId(100)))
            .is_none()
    );
}

#[test]
fn a_migration_walks_its_phases_and_switches_with_a_floor() {
    let (mut t, i) = table_with_cells();
    place(&mut t, 1, "eu/c1", i);
    let key = Key::conversation(TenantId(1), ConversationId(5));
    // Freeze before a migration began is illegal.
    assert!(matches!(
        update(&mut t, i + 1, key, i, Transition::Freeze),
        Err(RouteError::IllegalTransition { .. })
    ));
    update(
        &mut t,
        i + 2,
        key,
        i,
        Transition::BeginMigration { to: "eu/c2".into() },
    )
    .unwrap();
    update(
        &mut t,
        i + 3,
        key,
        i + 2,
        Transition::SetPhase(Phase::CatchUp),
    )
    .unwrap();
    // Phases never go back.
    assert!(update(&mut t, i + 4, key, i + 3, Transition::SetPhase(Phase::Copy)).is_err());
    update(&mut t, i + 5, key, i + 3, Transition::Freeze).unwrap();
    assert_eq!(
        t.entry(&key).unwrap().state,
        RouteState::Frozen { to: "eu/c2".into() }
    );
    // A stale compare-and-set is refused and changes nothing.
    let before = t.entry(&key).cloned();
    assert!(
        update(
            &mut t,
            i + 6,
            key,
            i + 3,
            Transition::Switch { seq_floor: 9 }
        )
        .is_err()
    );
    assert_eq!(t.entry(&key).cloned(), before);
    update(
        &mut t,
        i + 7,
        key,
        i + 5,
        Transition::Switch { seq_floor: 42 },
    )
    .unwrap();
    let r = t.resolve(&key).unwrap();
    assert_eq!(
        (r.entry.cell.as_str(), r.entry.epoch, r.seq_floor),
        ("eu/c2", i + 7, 42)
    );
    assert_eq!(r.entry.state, RouteState::Active);
}

#[test]
fn unknown_and_unusable_cells_are_refused() {
    let (mut t, i) = table_with_cells();
    let err = t
        .apply(
            &Command::AssignTenant {
                tenant: 1,
                cell: "eu/c9".into(),
                expect_epoch: 0,
            },
            i,
        )
        .unwrap_err();
    assert_eq!(err, RouteError::UnknownCell("eu/c9".into()));
    t.apply(
        &Command::SetCellStatus {
            id: "eu/c2".into(),
            status: CellStatus::Down,
        },
        i + 1,
    )
    .unwrap();
    assert!(matches!(
        t.apply(
            &Command::AssignTenant {
                tenant: 1,
                cell: "eu/c2".into(),
                expect_epoch: 0
            },
            i + 2
        ),
        Err(RouteError::Invalid { .. })
    ));
    for (id, region) in [
        ("c1", "eu"),
        ("eu/", "eu"),
        ("eu/c1", "us"),
        ("eu/c 1", "eu"),
    ] {
        let cmd = Command::RegisterCell {
            id: id.into(),
            region: region.into(),
            address: "http://x".into(),
            version: "0.2.0".into(),
            owner_lease_ms: 0,
        };
        assert!(t.apply(&cmd, i + 3).is_err(), "{id} in {region}");
    }
    assert_eq!(t.applied, i + 3);
}

#[test]
fn overrides_are_removed_only_when_they_agree_with_the_tenant() {
    let (mut t, i) = table_with_cells();
    place(&mut t, 1, "eu/c1", i);
    let user = Key::user(TenantId(1), UserId(3));
    assert!(update(&mut t, i + 1, user, i, Transition::Remove).is_err());
    update(
        &mut t,
        i + 2,
        user,
        i,
        Transition::Failover {
            to: "us/c1".into(),
            seq_floor: 0,
            floor_margin: 0,
        },
    )
    .unwrap();
    assert!(update(&mut t, i + 3, user, i + 2, Transition::Remove).is_err());
    update(
        &mut t,
        i + 4,
        user,
        i + 2,
        Transition::Failover {
            to: "eu/c1".into(),
            seq_floor: 0,
            floor_margin: 0,
        },
    )
    .unwrap();
    let changes = update(&mut t, i + 5, user, i + 4, Transition::Remove).unwrap();
    assert_eq!(changes, vec![Change::Removed(user)]);
    assert_eq!(t.effective(&user).unwrap().key, Key::tenant(TenantId(1)));
}

#[test]
fn a_moving_tenant_creates_on_its_target_and_its_conversations_move_alone() {
    let (mut t, i) = table_with_cells();
    place(&mut t, 1, "eu/c1", i);
    let tenant = Key::tenant(TenantId(1));
    let conv = Key::conversation(TenantId(1), ConversationId(10));
    // Placing needs a moving tenant.
    let place_on = |cell: &str| Transition::Place { cell: cell.into() };
    assert!(update(&mut t, i + 1, conv, i, place_on("eu/c2")).is_err());
    update(
        &mut t,
        i + 1,
        tenant,
        i,
        Transition::BeginMigration { to: "eu/c2".into() },
    )
    .unwrap();
    assert_eq!(t.creation_cell(TenantId(1)).unwrap().id, "eu/c2");
    // Only on the target, only for a conversation without an override.
    assert!(update(&mut t, i + 2, conv, i + 1, place_on("us/c1")).is_err());
    update(&mut t, i + 2, conv, i + 1, place_on("eu/c2")).unwrap();
    assert!(update(&mut t, i + 3, conv, i + 2, place_on("eu/c2")).is_err());
    let placed = t.resolve(&conv).unwrap().entry;
    assert_eq!(
        (placed.cell.as_str(), &placed.state),
        ("eu/c2", &RouteState::Active)
    );
    // An existing conversation without an override still lives on the
    // source and starts its own move from Active there.
    let old = Key::conversation(TenantId(1), ConversationId(11));
    update(
        &mut t,
        i + 3,
        old,
        i + 1,
        Transition::BeginMigration { to: "eu/c2".into() },
    )
    .unwrap();
    let moving = t.entry(&old).unwrap();
    assert_eq!(moving.cell, "eu/c1");
    assert!(matches!(moving.state, RouteState::Migrating { .. }));
}

#[test]
fn a_table_rebuilds_from_its_changes() {
    let (mut t, i) = table_with_cells();
    place(&mut t, 1, "eu/c1", i);
    let epoch = t.cell("eu/c1").unwrap().epoch;
    t.apply(&holders("eu/c1", &["eu/c2"], epoch), i + 1)
        .unwrap();
    let mut copy = RouteTable::default();
    for c in t.as_changes() {
        copy.apply_change(&c);
    }
    copy.applied = t.applied;
    assert_eq!(copy, t);
}

#[test]
fn the_safety_margin_covers_the_burst_and_two_checkpoint_intervals() {
    assert_eq!(safety_margin(100, 50, 1000), 250);
    assert_eq!(safety_margin(1, 0, 10), 1);
}

#[test]
fn standbys_are_the_fallback_and_the_first_cell_of_another_region() {
    let (mut t, i) = table_with_cells();
    let ids = |t: &RouteTable, cell: &str| -> Vec<String> {
        t.standbys_for(cell).iter().map(|c| c.id.clone()).collect()
    };
    let standbys = ids(&t, "eu/c1");
    assert_eq!(standbys, vec!["eu/c2", "us/c1"]);
    // eu/c1 fails over to eu/c2; when eu/c2 fails too, its fallback is
    // among eu/c1's standbys, so the conversations' meta is there.
    t.apply(
        &Command::SetCellStatus {
            id: "eu/c1".into(),
            status: CellStatus::Down,
        },
        i + 1,
    )
    .unwrap();
    let chained = t.fallback_for("eu/c2").map(|c| c.id.clone()).unwrap();
    assert!(standbys.contains(&chained), "{chained}");
    // With its region's other cell down, the fallback is already abroad.
    assert_eq!(ids(&t, "eu/c2"), vec!["us/c1"]);
}

fn holders(cell: &str, holders: &[&str], expect_epoch: u64) -> Command {
    Command::SetMarkHolders {
        cell: cell.into(),
        holders: holders.iter().map(|h| h.to_string()).collect(),
        expect_epoch,
    }
}

#[test]
fn mark_holders_are_compare_and_set_on_the_cell_and_survive_re_registration() {
    let (mut t, i) = table_with_cells();
    let epoch = t.cell("eu/c1").unwrap().epoch;
    t.apply(&holders("eu/c1", &["us/c1", "eu/c2", "eu/c2"], epoch), i)
        .unwrap();
    let cell = t.cell("eu/c1").unwrap().clone();
    assert_eq!(
        cell.mark_holders,
        vec!["eu/c2", "us/c1"],
        "sorted, once each"
    );
    assert_eq!(cell.epoch, i);
    // A writer that read the cell before that write conflicts.
    assert!(matches!(
        t.apply(&holders("eu/c1", &[], epoch), i + 1),
        Err(RouteError::StaleEpoch { .. })
    ));
    assert!(t.apply(&holders("eu/c1", &["eu/c1"], i), i + 2).is_err());
    assert!(t.apply(&holders("eu/c1", &["xx/c9"], i), i + 3).is_err());
    assert!(t.apply(&holders("xx/c9", &[], 0), i + 4).is_err());
    assert_eq!(t.cell("eu/c1").unwrap().mark_holders, cell.mark_holders);
    // A restarted cell registers again: its holders stay.
    t.apply(
        &Command::RegisterCell {
            id: "eu/c1".into(),
            region: "eu".into(),
            address: "http://127.0.0.1:9999".into(),
            version: "0.2.0".into(),
            owner_lease_ms: 0,
        },
        i + 5,
    )
    .unwrap();
    assert_eq!(t.cell("eu/c1").unwrap().mark_holders, cell.mark_holders);
}

#[test]
fn a_failover_goes_to_a_holder_of_the_marks_same_region_first() {
    let (mut t, i) = table_with_cells();
    // Owning nothing, a cell needs no marks: its fallback.
    assert_eq!(t.failover_target("eu/c1").unwrap().id, "eu/c2");
    place(&mut t, 1, "eu/c1", i);
    assert!(t.failover_target("eu/c1").is_none(), "no holder yet");
    let epoch = t.cell("eu/c1").unwrap().epoch;
    t.apply(&holders("eu/c1", &["us/c1"], epoch), i + 1)
        .unwrap();
    assert_eq!(t.failover_target("eu/c1").unwrap().id, "us/c1");
    t.apply(&holders("eu/c1", &["eu/c2", "us/c1"], i + 1), i + 2)
        .unwrap();
    assert_eq!(t.failover_target("eu/c1").unwrap().id, "eu/c2");
    t.apply(
        &Command::SetCellStatus {
            id: "eu/c2".into(),
            status: CellStatus::Down,
        },
        i + 3,
    )
    .unwrap();
    assert_eq!(t.failover_target("eu/c1").unwrap().id, "us/c1");
    // The failover writes the margin on the entry, nothing per
    // conversation: the new owner adds it to the mark it holds.
    let changes = update(
        &mut t,
        i + 4,
        Key::tenant(TenantId(1)),
        i,
        Transition::Failover {
            to: "us/c1".into(),
            seq_floor: 0,
            floor_margin: 100,
        },
    )
    .unwrap();
    assert_eq!(changes.len(), 1);
    let r = t
        .resolve(&Key::conversation(TenantId(1), ConversationId(10)))
        .unwrap();
    assert_eq!(
        (r.entry.cell.as_str(), r.entry.floor_margin),
        ("us/c1", 100)
    );
    assert_eq!(r.entry.failed_from.as_deref(), Some("eu/c1"));
}

fn register(
    t: &mut RouteTable,
    id: &str,
    version: &str,
    index: u64,
) -> Result<Vec<Change>, RouteError> {
    t.apply(
        &Command::RegisterCell {
            id: id.into(),
            region: id.split('/').next().unwrap().into(),
            address: format!("http://{id}"),
            version: version.into(),
            owner_lease_ms: 1_500,
        },
        index,
    )
}

fn finalize(t: &mut RouteTable, version: &str, index: u64) -> Result<Vec<Change>, RouteError> {
    t.apply(
        &Command::SetClusterVersion {
            version: version.into(),
        },
        index,
    )
}

#[test]
fn finalize_waits_for_every_live_cell_and_never_goes_back() {
    let mut t = RouteTable::default();
    register(&mut t, "eu/c1", "", 1).unwrap();
    register(&mut t, "eu/c2", "0.2.0", 2).unwrap();
    register(&mut t, "us/c1", "0.1.9", 3).unwrap();
    // Two laggards: the one from before releases, and 0.1.9; both named.
    let refused = finalize(&mut t, "0.2.0", 4).unwrap_err();
    let said = refused.to_string();
    assert!(matches!(refused, RouteError::VersionBehind(_)), "{said}");
    assert!(
        said.contains("eu/c1") && said.contains("us/c1") && !said.contains("eu/c2"),
        "{said}"
    );
    assert_eq!(t.cluster_version, "");
    assert!(finalize(&mut t, "0.2", 5).is_err(), "not MAJOR.MINOR.PATCH");

    // One upgrades; the other is Down (it cannot come back on the old
    // release: its registration is refused after the finalize).
    register(&mut t, "eu/c1", "0.2.0", 6).unwrap();
    t.apply(
        &Command::SetCellStatus {
            id: "us/c1".into(),
            status: CellStatus::Down,
        },
        7,
    )
    .unwrap();
    let changes = finalize(&mut t, "0.2.0", 8).unwrap();
    assert_eq!(changes, vec![Change::ClusterVersion("0.2.0".into())]);
    assert_eq!(t.cluster_version, "0.2.0");

    let late = register(&mut t, "us/c1", "0.1.9", 9).unwrap_err();
    assert!(matches!(late, RouteError::VersionBehind(_)), "{late}");
    assert!(
        register(&mut t, "us/c1", "", 10).is_err(),
        "a build from before releases"
    );
    register(&mut t, "us/c1", "0.3.0", 11).unwrap();
    assert!(finalize(&mut t, "0.1.0", 12).is_err(), "never lowered");
    finalize(&mut t, "0.2.0", 13).unwrap();

    // The version survives a rebuild from the table's changes (snapshots).
    let mut rebuilt = RouteTable::default();
    for change in t.as_changes() {
        rebuilt.apply_change(&change);
    }
    assert_eq!(rebuilt.cluster_version, "0.2.0");
    assert_eq!(rebuilt.cell("us/c1").unwrap().version, "0.3.0");
    // So does the owner lease the cell announced, through the protobuf
    // form snapshots and the watch carry.
    let cell = rebuilt.cell("us/c1").unwrap();
    assert_eq!(cell.owner_lease_ms, 1_500);
    let carried = crate::convert::cell_from_pb(crate::convert::cell_to_pb(cell)).unwrap();
    assert_eq!(carried.owner_lease_ms, 1_500);
}

#[test]
fn a_tenant_bound_to_regions_is_never_placed_or_moved_outside_them() {
    use cellmesh_proto::reason::Reason;
    let (mut t, i) = table_with_cells();
    place(&mut t, 1, "eu/c1", i);
    let epoch = |t: &RouteTable, key: &Key| t.effective(key).unwrap().epoch;
    let tenant = Key::tenant(TenantId(1));
    let bind = |regions: &[&str], expect_epoch| Command::SetTenantRegions {
        tenant: 1,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        expect_epoch,
    };
    // Refused while the tenant lives outside; then bound to eu.
    let e = t
        .apply(&bind(&["us"], epoch(&t, &tenant)), i + 1)
        .unwrap_err();
    assert_eq!(e.code().1, Reason::ResidencyViolation);
    t.apply(&bind(&["eu", "eu"], epoch(&t, &tenant)), i + 2)
        .unwrap();
    assert_eq!(t.regions_of(TenantId(1)), ["eu".to_string()]);
    let residency = |r: Result<Vec<Change>, RouteError>| {
        assert_eq!(r.unwrap_err().code().1, Reason::ResidencyViolation);
    };
    // A move of the tenant, of one conversation or of a user home to us.
    residency(t.apply(
        &Command::AssignTenant {
            tenant: 1,
            cell: "us/c1".into(),
            expect_epoch: epoch(&t, &tenant),
        },
        i + 3,
    ));
    for key in [
        Key::conversation(TenantId(1), ConversationId(5)),
        Key::user(TenantId(1), UserId(7)),
    ] {
        residency(t.apply(
            &Command::UpdateRoute {
                key,
                expect_epoch: epoch(&t, &key),
                transition: Transition::BeginMigration { to: "us/c1".into() },
            },
            i + 4,
        ));
    }
    // Inside the regions it moves; the override carries no regions of its own.
    let conv = Key::conversation(TenantId(1), ConversationId(5));
    t.apply(
        &Command::UpdateRoute {
            key: conv,
            expect_epoch: epoch(&t, &tenant),
            transition: Transition::BeginMigration { to: "eu/c2".into() },
        },
        i + 5,
    )
    .unwrap();
    assert!(t.entry(&conv).unwrap().regions.is_empty());
    // A new conversation of a tenant moving to us is not placed there
    // either: the tenant's own move was refused above, so unbind, start it,
    // bind again is refused while it moves outside.
    t.apply(&bind(&[], epoch(&t, &tenant)), i + 6).unwrap();
    t.apply(
        &Command::UpdateRoute {
            key: tenant,
            expect_epoch: epoch(&t, &tenant),
            transition: Transition::BeginMigration { to: "us/c1".into() },
        },
        i + 7,
    )
    .unwrap();
    residency(t.apply(&bind(&["eu"], epoch(&t, &tenant)), i + 8));
}
