//! [`Waiters`]: who waits on the pool, counted under the lock so that a
//! transition signals only when somebody waits for what it changed.
//! Callers waiting for room and for idleness are counted by a
//! [`Waiting`](crate::core::waits::Waiting) guard for as long as they wait;
//! functions of the pool waiting for one of its queued jobs, by an
//! [`OwnWait`](crate::core::waits::OwnWait).

/// Which waiter count a [`Waiting`](crate::core::waits::Waiting) guard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Callers waiting for room in a full queue (counted before their
    /// first try).
    Room,
    /// Of those, callers refused once whose job needs no limiter and has
    /// no key: such a job starts at once when a permit is free.
    RoomPlain,
    /// Waiters for idleness or termination (async, blocking, the monitor).
    Settle,
}

/// The waiter counts.
#[derive(Default)]
pub(crate) struct Waiters {
    room: usize,
    room_plain: usize,
    settle: usize,
    /// Running functions blocked waiting for a queued job of this pool.
    own: usize,
}

impl Waiters {
    /// How many waiters of `which` kind there are.
    #[cfg(all(test, not(loom)))]
    pub(super) fn of(&self, which: Wait) -> usize {
        match which {
            Wait::Room => self.room,
            Wait::RoomPlain => self.room_plain,
            Wait::Settle => self.settle,
        }
    }

    /// A waiter of `which` kind starts (`true`) or stops waiting.
    pub(super) fn count(&mut self, which: Wait, starts: bool) {
        let count = match which {
            Wait::Room => &mut self.room,
            Wait::RoomPlain => &mut self.room_plain,
            Wait::Settle => &mut self.settle,
        };
        if starts {
            *count += 1;
        } else {
            *count -= 1;
        }
    }

    /// How many callers wait for room.
    pub(super) fn room_count(&self) -> usize {
        self.room
    }

    /// Whether a caller waits for room.
    pub(super) fn for_room(&self) -> bool {
        self.room > 0
    }

    /// Whether a caller refused once waits for room with a job that needs
    /// no limiter and has no key.
    pub(super) fn for_room_plain(&self) -> bool {
        self.room_plain > 0
    }

    /// Whether somebody waits for idleness or termination.
    pub(super) fn for_settle(&self) -> bool {
        self.settle > 0
    }

    /// How many functions of the pool wait for one of its queued jobs.
    pub(super) fn own(&self) -> usize {
        self.own
    }

    /// A function of the pool starts (`true`) or stops waiting for one of
    /// its queued jobs.
    pub(super) fn count_own(&mut self, starts: bool) {
        if starts {
            self.own += 1;
        } else {
            self.own -= 1;
        }
    }
}
