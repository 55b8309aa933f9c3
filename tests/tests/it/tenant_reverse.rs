//! A tenant moved back to the cell it left, before that cell dropped its
//! copy (the reverse of a move): one more cutover that copies only what
//! changed since the switch — the conversations' new messages and the
//! homes' new events, not their whole queues again — while a client keeps
//! sending; nothing acknowledged is lost, duplicated or reordered, and the
//! old cell goes on after the last seq and pts.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::time::Duration;

use cellmesh_chaos::history::History;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;

const SOURCE: &str = "eu-west/c1";
const TARGET: &str = "us-east/c1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moved_back_within_the_grace_period_copies_only_what_changed() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversations = create_seeded(&mut m, &alice, 30, 20).await;
    let loaded = conversations[0];
    let senders = Senders::start(&d.edge, loaded, &[10, 11]);
    senders.until_acked(5, Duration::from_secs(10)).await;
    let migrator = migrator(&routes);

    let there = migrator
        .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
        .await
        .expect("the move succeeds");
    // Written on the target after the switch: what the move back copies.
    for n in 0..10 {
        m.send(authed(
            text(conversations[1], &format!("there-{n}")),
            &alice,
        ))
        .await
        .unwrap();
    }
    senders.until_acked(30, Duration::from_secs(10)).await;
    let back = migrator
        .migrate_tenant(TenantId(1), SOURCE, 4, |_| {})
        .await
        .expect("the move back succeeds");
    println!(
        "there: {} rows in {} ms; back: {} rows in {} ms, frozen {} ms",
        there.messages_moved,
        there.total.as_millis(),
        back.messages_moved,
        back.total.as_millis(),
        back.max_freeze.as_millis()
    );
    assert_eq!((back.from.as_str(), back.to.as_str()), (TARGET, SOURCE));
    assert_eq!(back.route_writes, 4 + back.overrides_removed);
    assert_eq!(back.users_moved, 2);
    // 600 seed messages and 1,200 sync events went there; back goes only
    // what was written since (10 messages and their 20 events, and the
    // loaded conversation's sends), not the homes' whole queues again.
    assert!(there.messages_moved >= 1_800, "{}", there.messages_moved);
    assert!(
        back.messages_moved >= 30 && back.messages_moved * 3 < there.messages_moved,
        "back {} rows, there {}",
        back.messages_moved,
        there.messages_moved
    );

    let ops = senders.finish(Duration::from_millis(300)).await;
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history
        .conversations
        .insert(loaded, history_via_edge(&mut m, &alice, loaded).await);
    assert_every_invariant(&history);
    for &c in &conversations[1..] {
        let h = history_via_edge(&mut m, &alice, c).await;
        let written = if c == conversations[1] { 30 } else { 20 };
        assert_eq!(h.len(), written, "conversation {c}: {h:?}");
        let owner = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(c)))
                .unwrap()
                .entry
                .cell
        });
        assert_eq!(owner, SOURCE);
    }
    // The homes are whole on the old cell again, and it goes on after them.
    for user in [10, 11] {
        let pts = |cell: &cellmesh_tests::TestCell| {
            cell.cell
                .service
                .store()
                .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(user)))
                .unwrap()
        };
        let (source, target) = (pts(&d.cells[0]), pts(&d.cells[1]));
        assert!(
            source >= target && target > 0,
            "user {user}: back home pts {source}, left behind {target}"
        );
    }
    let ack = m
        .send(authed(text(conversations[5], "home-again"), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.seq, 21);
}
