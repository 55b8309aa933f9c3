//! The pipeline's part of a sampled send's trace. An event carries its
//! trace as a `traceparent` string from record to record; each stage that
//! handles a traced event opens a span that follows it and hands its own
//! context on: `fanout` (this cell's members' queues), `forward` (the call
//! to another cell), `deliver` (that cell's members' queues) and `push`
//! (a member's live devices). A batch keeps its events' spans open until
//! it is durable and announced. A large group's event that no sampled send
//! traces starts its own `fanout` trace, kept at the large-group ratio.

use cellmesh_proto::ids::{ConversationId, UserId};
use std::collections::HashMap;

use cellmesh_telemetry::trace::{self, follow, sampler::LARGE_GROUP, traceparent};
use tracing::Span;

use crate::user::UserKey;

/// The spans of one batch's traced events.
#[derive(Default)]
pub(super) struct BatchTrace {
    spans: Vec<Span>,
    /// The event being applied: its span, and the context it hands on.
    current: Option<usize>,
    pub current_parent: String,
    /// Per member, the span of a traced event appended to their queue.
    users: HashMap<UserKey, usize>,
}

impl BatchTrace {
    /// Starts applying an event; `span` is its stage's span, if traced.
    pub fn event(&mut self, span: Option<Span>) {
        match span {
            Some(span) => {
                self.current_parent = traceparent(&span);
                self.spans.push(span);
                self.current = Some(self.spans.len() - 1);
            }
            None => {
                self.current = None;
                self.current_parent.clear();
            }
        }
    }

    /// The current event was appended to `user`'s queue.
    pub fn appended(&mut self, user: UserKey) {
        if let Some(i) = self.current {
            self.users.insert(user, i);
        }
    }

    /// A span for announcing `user`'s new events to their live devices,
    /// when a traced event is among them.
    pub fn push(&self, user: UserKey) -> Option<tracing::span::EnteredSpan> {
        let parent = &self.spans[*self.users.get(&user)?];
        Some(tracing::info_span!(parent: parent, "push", user_id = user.user.get()).entered())
    }
}

/// The `fanout` span of an event from this cell's queue.
pub(super) fn fanout(
    parent: &str,
    conversation: ConversationId,
    seq: u64,
    members: usize,
    large: bool,
) -> Option<Span> {
    if !trace::enabled() || (parent.is_empty() && !large) {
        return None;
    }
    let span = tracing::info_span!(
        "fanout",
        conv_id = conversation.get(),
        seq,
        members,
        { LARGE_GROUP } = large
    );
    if !parent.is_empty() {
        follow(&span, parent);
    }
    Some(span)
}

/// The `deliver` span of an event another cell forwarded here.
pub(super) fn deliver(
    parent: &str,
    conversation: ConversationId,
    seq: u64,
    user: UserId,
) -> Option<Span> {
    if parent.is_empty() || !trace::enabled() {
        return None;
    }
    let span = tracing::info_span!(
        "deliver",
        conv_id = conversation.get(),
        seq,
        user_id = user.get()
    );
    follow(&span, parent).then_some(span)
}
