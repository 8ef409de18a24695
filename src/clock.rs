//! Leaf module: time arithmetic on durations users give, which may be
//! anything up to `Duration::MAX`.

use std::time::{Duration, Instant};

/// Far enough ahead to mean "never" for a timer (about 30 years), near
/// enough that every timer implementation can hold it.
const NEVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `began + limit`, or a far-future instant if that overflows or is beyond
/// what timers hold: a user's `Duration::MAX` means "no limit", not a panic.
pub(crate) fn deadline_after(began: Instant, limit: Duration) -> Instant {
    began
        .checked_add(limit.min(NEVER))
        .or_else(|| began.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(began)
}
