//! Which spans the exporting layer sees: the cellmesh crates' at INFO and
//! above, next to the log layer's own filter (`RUST_LOG`). With two
//! per-layer filters, `tracing-subscriber` keeps each filter's verdict in a
//! thread-local between the `enabled` check and the span's creation. A
//! check with no span or event after it (`log_enabled!` in librdkafka's
//! client set-up, `tracing::enabled!`) leaves that verdict behind, and a
//! span whose callsite is cached as "always" skips the check and takes the
//! stale verdict: the exporter silently missed a cell's call span and its
//! children became a trace of their own. [`CellmeshSpans`] therefore never
//! caches "always": every span and event is checked when it is created.

use tracing::Metadata;
use tracing::subscriber::Interest;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Filter};

/// The exporting layer's filter (see the module's note).
#[derive(Clone, Debug)]
pub struct CellmeshSpans(Targets);

impl Default for CellmeshSpans {
    fn default() -> Self {
        Self(Targets::new().with_target("cellmesh", tracing::Level::INFO))
    }
}

impl<S> Filter<S> for CellmeshSpans {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.0.would_enable(meta.target(), meta.level())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.0.would_enable(meta.target(), meta.level()) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::INFO)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::filter::EnvFilter;
    use tracing_subscriber::prelude::*;

    use super::*;

    /// Counts the spans it is shown.
    #[derive(Clone, Default)]
    struct Seen(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_new_span(
            &self,
            _: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: Context<'_, S>,
        ) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_check_with_no_span_after_it_does_not_hide_the_next_span() {
        let seen = Seen::default();
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(EnvFilter::new("info"));
        let subscriber = tracing_subscriber::registry()
            .with(logs)
            .with(seen.clone().with_filter(CellmeshSpans::default()));
        tracing::subscriber::with_default(subscriber, || {
            for round in 1..=3 {
                // What librdkafka's client set-up does: the log layer wants
                // this, the exporting layer does not, and no event follows.
                let _ = tracing::enabled!(target: "librdkafka", tracing::Level::INFO);
                let _span = tracing::info_span!(target: "cellmesh_cell", "call").entered();
                assert_eq!(seen.0.load(Ordering::SeqCst), round, "round {round}");
            }
            // Others' spans and cellmesh's debug spans are not exported.
            let _ = tracing::info_span!(target: "h2", "stream");
            let _ = tracing::debug_span!(target: "cellmesh_cell", "detail");
            assert_eq!(seen.0.load(Ordering::SeqCst), 3);
        });
    }
}
