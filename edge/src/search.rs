//! `Search` at the edge. A caller's conversations may live on several cells
//! (tenant default, overrides, moves): the edge lists them at the caller's
//! home, asks every owning cell in parallel with a deadline, and merges the
//! pages newest first. A cell that does not answer in time makes the answer
//! `partial`, naming its conversations, instead of failing it.
//!
//! Paging across cells: each cell returns its newest visible hits and, when
//! it stopped before exhausting its matches, the smallest msg_id it
//! examined. Below the largest such bound some cell has not looked yet, so
//! the merged page keeps only hits at or above it; the cursor resumes below
//! the last hit kept (or the bound), strictly, on every cell.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::table::Key;
use tonic::{Request, Response, Status};

use crate::proxy::Proxy;

/// How long the edge waits for the cells of one search.
const DEADLINE: Duration = Duration::from_secs(3);
const DEFAULT_PAGE: usize = 20;

fn bad_cursor(message: &str) -> Status {
    to_status(
        ErrorCode::InvalidArgument,
        Reason::SearchCursorInvalid,
        message.to_string(),
        0,
        None,
    )
}

/// A cursor: the caller it was issued to and where the next page starts.
fn encode_cursor(tenant: TenantId, user: UserId, before: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("s1.{tenant}.{user}.{before}"))
}

fn decode_cursor(cursor: &str, tenant: TenantId, user: UserId) -> Result<Option<u64>, Status> {
    if cursor.is_empty() {
        return Ok(None);
    }
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| bad_cursor("the cursor is not one this service issued"))?;
    let parts: Vec<_> = text.split('.').collect();
    let [version, t, u, before] = parts[..] else {
        return Err(bad_cursor("the cursor is not one this service issued"));
    };
    let n = |s: &str| s.parse::<u64>().ok();
    match (version, n(t), n(u), n(before)) {
        ("s1", Some(t), Some(u), Some(b)) if t == tenant.get() && u == user.get() && b > 0 => {
            Ok(Some(b))
        }
        ("s1", Some(_), Some(_), Some(_)) => {
            Err(bad_cursor("the cursor was issued to another user"))
        }
        _ => Err(bad_cursor("the cursor is not one this service issued")),
    }
}

/// One cell's answer, or the conversations it leaves unsearched.
type CellAnswer = Result<SearchResponse, Vec<u64>>;

pub async fn search(
    proxy: &Proxy,
    request: Request<SearchRequest>,
) -> Result<Response<SearchResponse>, Status> {
    let (claims, mut m) = proxy.authenticate(request).await?;
    let before = decode_cursor(&m.cursor, claims.tenant, claims.user)?;
    m.cursor.clear();
    m.before_msg_id = before.unwrap_or(0);
    m.conversation_ids.clear();
    let want = match m.page_size {
        0 => DEFAULT_PAGE,
        n => n as usize,
    };
    let answers: Vec<CellAnswer> = if m.conversation_id != 0 {
        // One conversation: its owner answers, errors and all.
        let key = Key::conversation(claims.tenant, ConversationId(m.conversation_id));
        vec![Ok(ask(proxy, key, m).await?)]
    } else {
        let ids = conversations(proxy, claims.tenant, claims.user).await?;
        let mut by_cell: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut unrouted = Vec::new();
        for id in ids {
            match proxy
                .routes
                .resolve(&Key::conversation(claims.tenant, ConversationId(id)))
            {
                Some(route) => by_cell.entry(route.cell_address).or_default().push(id),
                None => unrouted.push(id),
            }
        }
        let calls = by_cell.into_values().map(|ids| {
            let mut r = m.clone();
            r.conversation_ids = ids.clone();
            let key = Key::conversation(claims.tenant, ConversationId(ids[0]));
            async move {
                match tokio::time::timeout(DEADLINE, ask(proxy, key, r)).await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(status)) => {
                        tracing::warn!(%status, "a cell did not answer a search");
                        Err(ids)
                    }
                    Err(_) => Err(ids),
                }
            }
        });
        let mut answers = futures::future::join_all(calls).await;
        if !unrouted.is_empty() {
            answers.push(Err(unrouted));
        }
        answers
    };
    Ok(Response::new(merge(
        answers,
        want,
        claims.tenant,
        claims.user,
    )))
}

async fn ask(proxy: &Proxy, key: Key, r: SearchRequest) -> Result<SearchResponse, Status> {
    let response = proxy
        .call(key, r, Some(DEADLINE), |channel, r| async move {
            MessagingClient::new(channel).search(r).await
        })
        .await?;
    Ok(response.into_inner())
}

/// The ids of the caller's conversations, from their home cell.
async fn conversations(proxy: &Proxy, tenant: TenantId, user: UserId) -> Result<Vec<u64>, Status> {
    let request = ListConversationsRequest {
        caller: Some(Caller {
            tenant_id: tenant.get(),
            user_id: user.get(),
            ..Default::default()
        }),
        ids_only: true,
        ..Default::default()
    };
    let response = proxy
        .call(
            Key::user(tenant, user),
            request,
            Some(DEADLINE),
            |channel, r| async move { SyncClient::new(channel).list_conversations(r).await },
        )
        .await?;
    Ok(response.into_inner().conversation_ids)
}

/// The cells' pages as one, newest first (see the module's paging note).
fn merge(answers: Vec<CellAnswer>, want: usize, tenant: TenantId, user: UserId) -> SearchResponse {
    let mut out = SearchResponse::default();
    let mut bound = 0;
    let mut hits = Vec::new();
    for answer in answers {
        match answer {
            Ok(a) => {
                bound = bound.max(a.examined_down_to);
                out.partial |= a.partial;
                out.unsearched.extend(a.unsearched);
                hits.extend(a.hits);
            }
            Err(ids) => {
                out.partial = true;
                out.unsearched.extend(ids);
            }
        }
    }
    let id = |h: &SearchHit| h.message.as_ref().map_or(0, |m| m.msg_id);
    hits.retain(|h| id(h) >= bound);
    hits.sort_by_key(|h| std::cmp::Reverse(id(h)));
    let next = if hits.len() > want {
        hits.truncate(want);
        hits.last().map_or(0, id)
    } else {
        bound
    };
    if next > 0 {
        out.next_cursor = encode_cursor(tenant, user, next);
    }
    out.unsearched.sort_unstable();
    out.hits = hits;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(msg_id: u64) -> SearchHit {
        SearchHit {
            message: Some(Message {
                msg_id,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn answer(ids: &[u64], examined_down_to: u64) -> CellAnswer {
        Ok(SearchResponse {
            hits: ids.iter().map(|&i| hit(i)).collect(),
            examined_down_to,
            ..Default::default()
        })
    }

    fn ids(r: &SearchResponse) -> Vec<u64> {
        r.hits
            .iter()
            .map(|h| h.message.as_ref().unwrap().msg_id)
            .collect()
    }

    #[test]
    fn a_page_keeps_only_what_every_cell_has_examined() {
        // Cell A stopped at 50 (more below), cell B is exhausted.
        let r = merge(
            vec![answer(&[90, 60, 50], 50), answer(&[70, 40, 10], 0)],
            5,
            TenantId(1),
            UserId(2),
        );
        assert_eq!(ids(&r), [90, 70, 60, 50]);
        assert_eq!(
            decode_cursor(&r.next_cursor, TenantId(1), UserId(2)).unwrap(),
            Some(50)
        );
    }

    #[test]
    fn a_full_page_resumes_below_its_last_hit_and_the_end_has_no_cursor() {
        let r = merge(
            vec![answer(&[9, 7], 0), answer(&[8, 6], 0)],
            3,
            TenantId(1),
            UserId(2),
        );
        assert_eq!(ids(&r), [9, 8, 7]);
        assert_eq!(
            decode_cursor(&r.next_cursor, TenantId(1), UserId(2)).unwrap(),
            Some(7)
        );
        let end = merge(
            vec![answer(&[5], 0), answer(&[], 0)],
            3,
            TenantId(1),
            UserId(2),
        );
        assert!(end.next_cursor.is_empty());
    }

    #[test]
    fn a_cell_that_did_not_answer_makes_the_answer_partial() {
        let r = merge(
            vec![answer(&[3], 0), Err(vec![44, 42])],
            10,
            TenantId(1),
            UserId(2),
        );
        assert!(r.partial);
        assert_eq!(r.unsearched, [42, 44]);
        assert_eq!(ids(&r), [3]);
    }

    #[test]
    fn a_cursor_of_another_user_or_a_forged_one_is_refused() {
        let c = encode_cursor(TenantId(1), UserId(2), 99);
        assert_eq!(decode_cursor(&c, TenantId(1), UserId(2)).unwrap(), Some(99));
        for (cursor, tenant, user) in [
            (c.as_str(), 1, 3),
            (c.as_str(), 7, 2),
            ("!!", 1, 2),
            ("czEuMQ", 1, 2),
        ] {
            let status = decode_cursor(cursor, TenantId(tenant), UserId(user)).unwrap_err();
            let detail = cellmesh_proto::status::error_detail(&status);
            assert_eq!(detail.reason, Reason::SearchCursorInvalid.as_str());
        }
    }
}
