//! History as users see it: recall and edit show current state, delete-for-me
//! hides for one user only, read state never moves backwards, idempotency
//! records expire after their TTL, and state survives a clean restart.

use cellmesh_proto::reason::Reason;
use std::sync::Arc;

use cellmesh_cell::clock::ManualClock;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::*;
use cellmesh_tests::*;

const T: u64 = 5;

#[tokio::test]
async fn recall_edit_and_delete_for_me_show_in_history() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    for i in 1..=5 {
        c.send(text(T, 1, conv, &format!("m{i}"), &format!("msg {i}")))
            .await
            .unwrap();
    }
    let recalled = c
        .recall(RecallRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 2,
        })
        .await
        .unwrap()
        .into_inner()
        .message
        .unwrap();
    assert_eq!(recalled.state, MessageState::Recalled as i32);
    let edited = c
        .edit(EditRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 3,
            body: b"fixed".to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .message
        .unwrap();
    assert_eq!(
        (edited.edit_version, edited.body.as_slice()),
        (1, &b"fixed"[..])
    );
    let status = c
        .edit(EditRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 2,
            body: b"x".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        error_detail(&status).reason,
        Reason::MessageRecalled.as_str()
    );
    c.delete_for_me(DeleteForMeRequest {
        caller: caller(T, 2),
        conversation_id: conv,
        seqs: vec![4, 1],
    })
    .await
    .unwrap();

    let for_sender = pull_all(&mut c, T, 1, conv).await;
    assert_eq!(for_sender.len(), 5);
    assert!(for_sender[1].body.is_empty() && for_sender[1].state == MessageState::Recalled as i32);
    assert_eq!(for_sender[2].body, b"fixed");
    assert_eq!(for_sender[2].state, MessageState::Edited as i32);

    let for_other = pull_all(&mut c, T, 2, conv).await;
    assert_eq!(
        for_other.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![2, 3, 5]
    );
    // Backward paging over the overlay agrees.
    let mut back = pull_pages(&mut c, T, 2, conv, Direction::Backward, 1).await;
    back.reverse();
    assert_eq!(back, for_other);
    cell.stop().await;
}

#[tokio::test]
async fn read_state_never_moves_backwards() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    for i in 1..=10 {
        c.send(text(T, 1, conv, &format!("r{i}"), "x"))
            .await
            .unwrap();
    }
    let mark = |seq| MarkReadRequest {
        caller: caller(T, 2),
        conversation_id: conv,
        read_seq: seq,
    };
    let r = c.mark_read(mark(7)).await.unwrap().into_inner();
    assert_eq!((r.read_seq, r.unread), (7, 3));
    let r = c.mark_read(mark(3)).await.unwrap().into_inner();
    assert_eq!(
        (r.read_seq, r.unread),
        (7, 3),
        "a lower read_seq does not move it back"
    );
    let r = c.mark_read(mark(1_000)).await.unwrap().into_inner();
    assert_eq!(
        (r.read_seq, r.latest_seq, r.unread),
        (10, 10, 0),
        "capped at latest"
    );
    let info = c
        .get_conversation(GetConversationRequest {
            caller: caller(T, 2),
            conversation_id: conv,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.read_seq, info.unread), (10, 0));
    assert_eq!(info.member_ids, vec![1, 2]);
    // Sending reads up to your own message: the sender has nothing unread,
    // until someone else writes.
    let reader = c.clone();
    let unread_of = |user| {
        let mut c = reader.clone();
        async move {
            c.get_conversation(GetConversationRequest {
                caller: caller(T, user),
                conversation_id: conv,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let info = unread_of(1).await;
    assert_eq!((info.read_seq, info.unread), (10, 0));
    c.send(text(T, 2, conv, "reply", "x")).await.unwrap();
    assert_eq!(unread_of(1).await.unread, 1);
    assert_eq!(unread_of(2).await.read_seq, 11);
    cell.stop().await;
}

#[tokio::test]
async fn idempotency_expires_after_its_ttl() {
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let cell = TestCell::start_with(|c| c.idempotency.ttl_secs = 60, clock.clone()).await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let first = c
        .send(text(T, 1, conv, "k", "a"))
        .await
        .unwrap()
        .into_inner();
    clock.advance_ms(59_000);
    let repeat = c
        .send(text(T, 1, conv, "k", "a"))
        .await
        .unwrap()
        .into_inner();
    assert!(repeat.duplicate && repeat.seq == first.seq);
    clock.advance_ms(2_000);
    let fresh = c
        .send(text(T, 1, conv, "k", "a"))
        .await
        .unwrap()
        .into_inner();
    assert!(!fresh.duplicate);
    assert_eq!(fresh.seq, first.seq + 1);
    cell.stop().await;
}

#[tokio::test]
async fn members_change_and_state_survives_restart() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let added = c
        .add_members(ChangeMembersRequest {
            caller: caller(T, 2),
            conversation_id: conv,
            user_ids: vec![3, 4, 2],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.changed, vec![3, 4]);
    assert_eq!(added.conversation.unwrap().member_count, 4);
    c.send(text(T, 4, conv, "from-4", "hi")).await.unwrap();
    let removed = c
        .remove_members(ChangeMembersRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            user_ids: vec![4],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.conversation.unwrap().member_count, 3);
    assert!(c.send(text(T, 4, conv, "from-4b", "hi")).await.is_err());

    // Clean restart over the same directory.
    let dir = cell.stop().await;
    let mut config = test_config(dir.path());
    config.listen = "127.0.0.1:0".parse().unwrap();
    let cell = cellmesh_cell::start(
        config,
        Arc::new(cellmesh_cell::ownership::OwnAll),
        Arc::new(cellmesh_cell::clock::SystemClock),
    )
    .await
    .unwrap();
    let mut c = connect(&format!("http://{}", cell.addr)).await;
    let history = pull_all(&mut c, T, 1, conv).await;
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].sender_id, 4);
    let next = c
        .send(text(T, 3, conv, "from-3", "hey"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.seq, 2);
    cell.shutdown().await.unwrap();
}

/// Any member adds members and leaves; the creator and the admins it (or
/// another admin) made remove others (`PERMISSION_DENIED` /
/// `NOT_CONVERSATION_ADMIN`, nothing removed); the creator is not removed
/// and stays an admin; a member who leaves is no longer an admin.
#[tokio::test]
async fn admins_remove_others_and_anyone_leaves() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3, 4, 5]).await;
    let remove = |by: u64, users: Vec<u64>| ChangeMembersRequest {
        caller: caller(T, by),
        conversation_id: conv,
        user_ids: users,
    };
    let role = |by: u64, user: u64, admin: bool| SetMemberRoleRequest {
        caller: caller(T, by),
        conversation_id: conv,
        user_id: user,
        admin,
    };
    let reason = |e: tonic::Status| (e.code(), error_detail(&e).reason);
    let not_admin = (
        tonic::Code::PermissionDenied,
        Reason::NotConversationAdmin.as_str().to_string(),
    );
    for (by, users) in [(2, vec![3]), (2, vec![2, 1])] {
        let e = c
            .remove_members(remove(by, users.clone()))
            .await
            .unwrap_err();
        assert_eq!(reason(e), not_admin, "user {by} removes {users:?}");
    }
    let e = c.set_member_role(role(2, 3, true)).await.unwrap_err();
    assert_eq!(reason(e), not_admin, "a member makes admins");

    // The creator makes 2 an admin; 2 removes 3 and makes 4 an admin.
    let made = c
        .set_member_role(role(1, 2, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.conversation.unwrap().admin_ids, vec![2]);
    let removed = c
        .remove_members(remove(2, vec![3]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.changed, vec![3], "an admin removes");
    let e = c.remove_members(remove(2, vec![1])).await.unwrap_err();
    assert_eq!(reason(e), not_admin, "an admin removes the creator");
    c.set_member_role(role(2, 4, true)).await.unwrap();
    // The creator takes 2's role back: 2 removes no one any more.
    let taken = c
        .set_member_role(role(1, 2, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(taken.conversation.unwrap().admin_ids, vec![4]);
    let e = c.remove_members(remove(2, vec![5])).await.unwrap_err();
    assert_eq!(reason(e), not_admin, "a former admin removes");
    for (request, expected) in [
        (role(4, 1, false), Reason::IllegalTransition.as_str()),
        (role(4, 3, true), Reason::RecipientNotAMember.as_str()),
        (role(4, 0, true), Reason::InvalidUserId.as_str()),
    ] {
        let e = c.set_member_role(request).await.unwrap_err();
        assert_eq!(
            reason(e),
            (tonic::Code::InvalidArgument, expected.to_string())
        );
    }
    // An admin who leaves is no longer one; the role survives in the
    // stored record (read back through GetConversation).
    let left = c
        .remove_members(remove(4, vec![4]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left.changed, vec![4], "a member leaves");
    assert!(left.conversation.unwrap().admin_ids.is_empty());
    c.set_member_role(role(1, 5, true)).await.unwrap();
    let viewed = c
        .get_conversation(GetConversationRequest {
            caller: caller(T, 2),
            conversation_id: conv,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(viewed.conversation.unwrap().admin_ids, vec![5]);
    let removed = c
        .remove_members(remove(1, vec![2]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.changed, vec![2], "the creator removes");
    assert_eq!(removed.conversation.unwrap().member_count, 2);
}
