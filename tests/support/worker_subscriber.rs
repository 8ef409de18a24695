//! A process-wide tracing subscriber for test binaries of their own: it
//! listens at a level the test sets (read at every call) and calls a hook
//! for each event emitted on one of the pool's threads.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

struct OnPoolThreads {
    ids: AtomicU64,
    level: fn() -> LevelFilter,
    on_event: fn(),
}

impl Subscriber for OnPoolThreads {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some((self.level)())
    }
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= (self.level)()
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.ids.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        let on_pool_thread = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("offloader"));
        if on_pool_thread {
            (self.on_event)();
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Installs the subscriber for the whole process: at the level `level`
/// returns (after a change, call `tracing::callsite::rebuild_interest_cache`),
/// calling `on_event` for every event on a pool thread.
pub(crate) fn install(level: fn() -> LevelFilter, on_event: fn()) {
    tracing::subscriber::set_global_default(OnPoolThreads {
        ids: AtomicU64::new(1),
        level,
        on_event,
    })
    .expect("the only subscriber of this test binary");
}
