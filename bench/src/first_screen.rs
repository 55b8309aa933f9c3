//! The first screen of `bench group`: members pulling the newest page of a
//! conversation, as they do on opening it or after a hint, many at once.
//! The hot group's page comes from the newest messages the cell keeps in
//! memory; a 1:1 neighbour's, below the large-group threshold, from
//! storage: the two side by side.

use std::time::Instant;

use cellmesh_client::connect::{call_error, caller};
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1::{Direction, PullRequest};
use hdrhistogram::Histogram;

use crate::send::Client;
use crate::{Report, group::ms, histogram};

/// Pulls in all, and how many callers pull at once.
const PULLS: u64 = 4_000;
const PULLERS: u64 = 16;
/// The page: the newest 50.
const PAGE: u32 = 50;

/// The first screen of the hot group (from memory) and of a 1:1 pair
/// (from storage): latency (µs) and pages per second.
pub struct FirstScreens {
    group: (Histogram<u64>, f64),
    pair: (Histogram<u64>, f64),
}

/// Pulls the newest page of `group` (with its member count and the
/// newest seq sent into it) by every member in turn, then of `pair` by its
/// two members (the first is `user`).
pub async fn measure(
    client: &Client,
    tenant: TenantId,
    (group, members, newest): (ConversationId, u64, Option<u64>),
    (pair, user): (ConversationId, UserId),
) -> anyhow::Result<FirstScreens> {
    let every_member = |i| UserId(1 + i % members);
    let either = |i| UserId(user.get() + i % 2);
    Ok(FirstScreens {
        group: pull_newest(client, tenant, group, every_member, newest).await?,
        pair: pull_newest(client, tenant, pair, either, None).await?,
    })
}

impl FirstScreens {
    pub fn params(&self, report: Report) -> Report {
        let ((group, group_per_s), (pair, pair_per_s)) = (&self.group, &self.pair);
        report
            .param("first_screen_p50_ms", ms(group, 0.5))
            .param("first_screen_p99_ms", ms(group, 0.99))
            .param("first_screen_pages_per_s", *group_per_s)
            .param("stored_page_p50_ms", ms(pair, 0.5))
            .param("stored_page_p99_ms", ms(pair, 0.99))
            .param("stored_pages_per_s", *pair_per_s)
    }
}

/// Latency (µs) of `PULLS` newest pages of `conversation`, pulled by
/// `member(i)` for the i-th pull, and pages per second; fails when a page
/// is not the newest `PAGE` (ending at `newest`, when given).
async fn pull_newest(
    client: &Client,
    tenant: TenantId,
    conversation: ConversationId,
    member: impl Fn(u64) -> UserId,
    newest: Option<u64>,
) -> anyhow::Result<(Histogram<u64>, f64)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for puller in 0..PULLERS {
        let mut client = client.clone();
        let callers: Vec<UserId> = (0..PULLS / PULLERS)
            .map(|i| member(puller + i * PULLERS))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            for user in callers {
                let at = Instant::now();
                let page = client
                    .pull(PullRequest {
                        caller: caller(tenant.get(), user.get()),
                        conversation_id: conversation.get(),
                        since_seq: 0,
                        direction: Direction::Backward as i32,
                        limit: PAGE,
                    })
                    .await
                    .map_err(call_error)?
                    .into_inner();
                h.record((at.elapsed().as_micros() as u64).max(1))?;
                let top = page.messages.first().map(|m| m.seq);
                anyhow::ensure!(
                    page.messages.len() == PAGE as usize
                        && newest.is_none_or(|n| top == Some(n))
                        && top == Some(page.latest_seq),
                    "conversation {conversation}: a page of {} from seq {top:?}, latest {}",
                    page.messages.len(),
                    page.latest_seq
                );
            }
            Ok(h)
        }));
    }
    let mut all = histogram();
    for task in tasks {
        all.add(task.await??)?;
    }
    let per_s = all.len() as f64 / started.elapsed().as_secs_f64();
    Ok((all, per_s))
}
