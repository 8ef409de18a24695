//! EXPERIMENTAL, branch `order` only, never to land as is: the queue
//! discipline under overload, chosen by the environment variable
//! `OFFLOADER_ORDER` read once when a pool is built (issue 32, item 3).
//!
//! - `fifo` (or unset): the order the pool has always had.
//! - `lifo`: adaptive LIFO (Wangle): while the lane's oldest queued job has
//!   waited longer than a target (`OFFLOADER_ORDER_TARGET_MS`, 10 by
//!   default), the newest queued job starts instead of the oldest.
//! - `codel`: Wangle's CoDel: the lane is *overloaded* for an interval
//!   (100 ms) when the least queueing delay seen in the interval before
//!   exceeded the target (`OFFLOADER_ORDER_TARGET_MS`, 5 by default); while
//!   overloaded, a job whose turn comes after waiting more than twice the
//!   target is shed as a deadline shed is (`Queued → Shed`,
//!   `Error::Overloaded`), if its abandon policy lets the pool shed it.
//!
//! Admission and the deadline shed at a job's turn are the same in all
//! three.

use std::time::Duration;

/// The queue discipline of the pool's lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Fifo,
    Lifo { target_ns: u64 },
    Codel { target_ns: u64, interval_ns: u64 },
}

impl Order {
    /// From `OFFLOADER_ORDER` and `OFFLOADER_ORDER_TARGET_MS`.
    pub(crate) fn from_env() -> Self {
        let target = |default: u64| {
            let ms = std::env::var("OFFLOADER_ORDER_TARGET_MS")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(default as f64);
            u64::try_from(Duration::from_secs_f64(ms.max(0.0) / 1e3).as_nanos()).unwrap_or(u64::MAX)
        };
        match std::env::var("OFFLOADER_ORDER").as_deref() {
            Ok("lifo") => Order::Lifo {
                target_ns: target(10),
            },
            Ok("codel") => Order::Codel {
                target_ns: target(5),
                interval_ns: 100_000_000,
            },
            _ => Order::Fifo,
        }
    }
}

/// A lane's CoDel state (folly's `Codel::overloaded`).
#[derive(Default)]
pub(super) struct Codel {
    min_delay: u64,
    interval_end: u64,
    reset: bool,
    overloaded: bool,
}

impl Codel {
    /// Counts the queueing `delay` of a job whose turn came at `now`
    /// (both in ns); `true` if the job should be shed.
    pub(super) fn judge(&mut self, now: u64, delay: u64, target: u64, interval: u64) -> bool {
        if now > self.interval_end && !self.reset {
            self.reset = true;
            self.interval_end = now.saturating_add(interval);
            self.overloaded = self.min_delay > target;
        }
        if self.reset {
            self.reset = false;
            self.min_delay = delay;
            return false;
        }
        self.min_delay = self.min_delay.min(delay);
        self.overloaded && delay > target.saturating_mul(2)
    }
}
