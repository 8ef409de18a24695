//! Waits registered with a pool: a function of the pool blocked on a
//! queued job of the same pool ([`OwnWait`], refused with
//! [`Error::WouldDeadlock`] when it could never end), and the waiter counts
//! that tell the transitions whom to signal ([`Waiting`]).

use crate::core::pool::Inner;
use crate::core::state::Wait;
use crate::job::error::Error;
use crate::job::record::JobCore;

/// A function of a pool blocked waiting for a queued job of the same pool
/// (src/core/README.md "Waiting from inside the pool"); dropping it ends the
/// wait's registration.
pub(crate) struct OwnWait<'a> {
    inner: &'a Inner,
    mark: Option<crate::core::state::OwnWaitMark>,
}

impl Drop for OwnWait<'_> {
    fn drop(&mut self) {
        if let Some(mark) = self.mark.take() {
            self.inner.lock().own_wait_ended(mark);
        }
    }
}

impl Inner {
    /// Registers a blocking wait for `core` made by a function running on
    /// this pool while `core` is queued. Fails with
    /// [`Error::WouldDeadlock`] if that would make every permit held by such
    /// a wait (the job could never start). `None` when the wait is not from
    /// this pool's worker or the job is not queued.
    pub(crate) fn enter_own_wait(&self, core: &JobCore) -> Result<Option<OwnWait<'_>>, Error> {
        if !self.is_own_worker() {
            return Ok(None);
        }
        let mut s = self.lock();
        if core.state() != crate::job::id::JobState::Queued {
            return Ok(None);
        }
        match s.own_wait_begins(crate::util::sync::current_job(), core) {
            Ok(mark) => Ok(Some(OwnWait {
                inner: self,
                mark: Some(mark),
            })),
            Err(()) => {
                drop(s);
                tracing::warn!(id = core.id.0, "a function blocked waiting for a queued job of its own pool, key or limiter with every permit so held: refused instead of deadlocking");
                Err(Error::WouldDeadlock { id: core.id })
            }
        }
    }
}

/// Counts one waiter in a [`State`](crate::core::state::State) waiter count for as long as it exists,
/// so that the transitions it waits for signal it; a dropped wait (a future
/// cancelled mid-await) unregisters. The one way waiters are counted.
pub(crate) struct Waiting<'a> {
    inner: &'a Inner,
    which: Wait,
}

impl<'a> Waiting<'a> {
    pub(crate) fn new(inner: &'a Inner, which: Wait) -> Self {
        inner.lock().count_waiter(which, true);
        Waiting { inner, which }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inner.lock().count_waiter(self.which, false);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::core::pool::Offloader;

    /// A waiter count is exact: it grows with each registration and falls
    /// back when the registration is dropped (a cancelled wait included),
    /// so that transitions stop signalling once nobody waits.
    #[test]
    fn a_dropped_registration_unregisters() {
        let pool = Offloader::builder().build().expect("valid configuration");
        let inner = pool.inner();
        for which in [Wait::Room, Wait::RoomPlain, Wait::Settle] {
            let a = Waiting::new(inner, which);
            let b = Waiting::new(inner, which);
            assert_eq!(inner.lock().waiters(which), 2);
            drop(a);
            assert_eq!(inner.lock().waiters(which), 1);
            drop(b);
            assert_eq!(inner.lock().waiters(which), 0);
        }
    }
}
