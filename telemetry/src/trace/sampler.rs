//! Which traces are kept. Parent-based: a span whose caller's context came
//! along follows the caller's decision, so a trace is kept whole or not at
//! all. Client and operator calls are decided at the head, by the server
//! layer ([`super::grpc`]) at the configured ratio (5% by default), before
//! any span exists: a kept one is a root span that asks to be kept
//! ([`ALWAYS`]` = true`, as migrations and failovers do). Another new
//! trace is kept at the configured ratio, and one that says it is a large
//! group's fan-out ([`LARGE_GROUP`]` = true`) at the large-group ratio
//! (20%).

use opentelemetry::trace::{Link, SpanKind, TraceId};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{Sampler, SamplingResult, ShouldSample};

/// Root-span attribute: a send into a conversation above the large-group
/// threshold.
pub const LARGE_GROUP: &str = "cellmesh.large_group";
/// Root-span attribute: keep this trace whatever the ratio.
pub const ALWAYS: &str = "cellmesh.always_sample";

#[derive(Debug, Clone)]
pub struct CellmeshSampler {
    normal: Sampler,
    large: Sampler,
    always: Sampler,
}

impl CellmeshSampler {
    pub fn new(ratio: f64, large_group_ratio: f64) -> Self {
        let parent_based = |root| Sampler::ParentBased(Box::new(root));
        Self {
            normal: parent_based(Sampler::TraceIdRatioBased(ratio)),
            large: parent_based(Sampler::TraceIdRatioBased(large_group_ratio.max(ratio))),
            always: parent_based(Sampler::AlwaysOn),
        }
    }
}

fn flag(attributes: &[KeyValue], key: &str) -> bool {
    attributes
        .iter()
        .any(|kv| kv.key.as_str() == key && kv.value == Value::Bool(true))
}

impl ShouldSample for CellmeshSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let sampler = if flag(attributes, ALWAYS) {
            &self.always
        } else if flag(attributes, LARGE_GROUP) {
            &self.large
        } else {
            &self.normal
        };
        sampler.should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::SamplingDecision;

    fn kept(sampler: &CellmeshSampler, parent: Option<&Context>, attributes: &[KeyValue]) -> u32 {
        (1..=20_000u128)
            .filter(|i| {
                let id = TraceId::from(i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835));
                let result =
                    sampler.should_sample(parent, id, "Send", &SpanKind::Server, attributes, &[]);
                result.decision == SamplingDecision::RecordAndSample
            })
            .count() as u32
    }

    #[test]
    fn roots_are_kept_at_their_ratio_and_large_groups_more_often() {
        let sampler = CellmeshSampler::new(0.05, 0.2);
        let normal = kept(&sampler, None, &[]);
        assert!((800..1_200).contains(&normal), "5% of 20,000: {normal}");
        let large = kept(&sampler, None, &[KeyValue::new(LARGE_GROUP, true)]);
        assert!((3_600..4_400).contains(&large), "20% of 20,000: {large}");
        let always = kept(&sampler, None, &[KeyValue::new(ALWAYS, true)]);
        assert_eq!(always, 20_000);
    }

    #[test]
    fn a_child_follows_its_parent() {
        let sampler = CellmeshSampler::new(0.05, 0.2);
        let parent = |flags| {
            Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from(7u128),
                SpanId::from(9u64),
                flags,
                true,
                TraceState::default(),
            ))
        };
        let sampled = parent(TraceFlags::SAMPLED);
        assert_eq!(kept(&sampler, Some(&sampled), &[]), 20_000);
        let dropped = parent(TraceFlags::default());
        let large = [KeyValue::new(LARGE_GROUP, true)];
        assert_eq!(kept(&sampler, Some(&dropped), &large), 0);
    }
}
