//! Job groups ([`JobGroup`](crate::JobGroup)): each group's counts and live
//! members, kept in the critical sections of the job transitions they
//! follow, so that a group's ledger is as exact as the pool's and a stop
//! reaches every queued and running job of a group and of its descendants.
//!
//! # Invariants
//!
//! - **G1 (ledger).** A group's counts cover its own jobs and its
//!   descendants' jobs. Each moves in the critical section of the job
//!   transition it counts (every transition walks the job's group and its
//!   ancestors: O(depth), independent of the queue), so every snapshot has
//!   `accepted = queued + running + terminal`.
//! - **G2 (stop).** A stop marks the group and its descendants stopped in the
//!   critical section in which it cancels their queued members and sets the
//!   stop flag of their running ones: a job accepted before it is reached,
//!   a job offered after it is refused, and every member is stopped at once.
//! - **G3 (lifetime).** A group's record lives while a handle, a child record,
//!   one of its own jobs not yet published or a `stop_on` watch refers to it,
//!   so the group key a job carries stays valid until the job's outcome is
//!   published, and a watch's until it lets go. When only watches are left
//!   (the group has *ended*: nothing of it is left to stop), they are woken
//!   through its idle waiters' list, and let go.
//! - **G4 (members).** A group's members are exactly its own jobs that are
//!   queued or running: a job joins in *accept* and leaves in the transition
//!   that makes it terminal.

use super::After;
use crate::core::metrics::GroupMetrics;
use crate::job::error::Error;
use crate::job::id::{CANCELLED, COMPLETED, PANICKED, QUEUED, RUNNING, SHED, UNSTARTED};
use crate::job::record::JobCore;
use crate::util::slab::{Key, List, Slab};
use crate::util::wait_list::WaitList;

/// The pool's job groups: one record per live group, linked to its parent
/// and children (G1–G4). Only the transitions that also touch jobs, lanes
/// or waiters (a group stop, a close) live outside this type.
#[derive(Default)]
pub(crate) struct Groups {
    recs: Slab<GroupRec>,
}

/// One group's record in the pool's state.
#[derive(Default)]
pub(crate) struct GroupRec {
    /// This record's own key.
    key: Key,
    parent: Option<Key>,
    /// Live child records, linked through the group slab (O(1) unlink).
    children: List,
    /// Async waiters for this group's idleness, made by the first one.
    idle_waiters: Option<std::sync::Arc<WaitList>>,
    /// Own queued and running jobs, by their key in the pool's job slab
    /// (G4), linked in `member_list`.
    members: Slab<Key>,
    member_list: List,
    /// Live `JobGroup` handles.
    handles: usize,
    /// `stop_on` watches that follow the group (interop.rs).
    watches: usize,
    /// Own jobs accepted and not yet published (G3).
    own_pending: usize,
    stopped: bool,
    /// New jobs are refused (a close began, or a stop).
    closed: bool,
    counts: GroupMetrics,
    /// Jobs of this group or its descendants accepted and not yet published:
    /// the group is idle when it is zero.
    pending: u64,
}

impl Groups {
    /// Creates a group (a child of `parent`, if given) with one handle.
    /// A child of a stopped or closed group is born so.
    pub(crate) fn create(&mut self, parent: Option<Key>) -> Key {
        let (stopped, closed) = parent
            .and_then(|p| self.recs.get(p))
            .map_or((false, false), |p| (p.stopped, p.closed));
        let key = self.recs.insert(GroupRec {
            parent,
            handles: 1,
            stopped,
            closed,
            ..GroupRec::default()
        });
        if let Some(g) = self.recs.get_mut(key) {
            g.key = key;
        }
        if let Some(p) = parent {
            self.with_children(p, |recs, list| recs.push_back(list, key));
        }
        key
    }

    /// A handle to group `key` was dropped.
    pub(crate) fn handle_dropped(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.recs.get_mut(key) {
            g.handles -= 1;
        }
        self.free_unused(key, after);
    }

    /// A `stop_on` watch follows group `key` from now until
    /// [`unwatch`](Self::unwatch): the record stays (G3). Returns the list
    /// that wakes the watch when the group has ended.
    #[cfg(feature = "tokio-util")]
    pub(crate) fn watch(&mut self, key: Key) -> Option<std::sync::Arc<WaitList>> {
        let g = self.recs.get_mut(key)?;
        g.watches += 1;
        Some(g.idle_waiters.get_or_insert_with(Default::default).clone())
    }

    /// A watch of group `key` lets go of its record.
    #[cfg(feature = "tokio-util")]
    pub(crate) fn unwatch(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.recs.get_mut(key) {
            g.watches -= 1;
        }
        self.free_unused(key, after);
    }

    /// Whether group `key` has ended: nothing but watches refers to its
    /// record (no handle, no child, no own job unpublished), so nothing of
    /// it is left to stop (G3).
    #[cfg(feature = "tokio-util")]
    pub(crate) fn ended(&self, key: Key) -> bool {
        self.recs.get(key).is_none_or(GroupRec::ended)
    }

    /// Whether a job offloaded through its group may join it: refused if
    /// the group is stopped (G2).
    pub(crate) fn admits(&mut self, core: &JobCore) -> Result<(), Error> {
        let Some(m) = core.membership() else {
            return Ok(());
        };
        if !self.recs.get(m.group).is_some_and(|g| g.closed) {
            return Ok(());
        }
        self.each(m.group, |c| c.counts.rejected += 1);
        Err(Error::Cancelled { id: None })
    }

    /// Part of *accept*: the job `job` (key in the job slab) joins its
    /// group, if it has one (G4), and is counted there and above.
    pub(crate) fn join(&mut self, core: &JobCore, job: Key) {
        let Some(m) = core.membership() else {
            return;
        };
        let Some(g) = self.recs.get_mut(m.group) else {
            return;
        };
        let member = g.members.insert(job);
        g.members.push_back(&mut g.member_list, member);
        m.set_member(member);
        g.own_pending += 1;
        self.each(m.group, |c| {
            c.counts.accepted += 1;
            c.counts.queued += 1;
            c.pending += 1;
        });
    }

    /// Part of a job transition from `from` to `to` (state words): moves
    /// the job's counts in its group and above (G1); a terminal job leaves
    /// its group's members (G4).
    pub(crate) fn moved(&mut self, core: &JobCore, from: u8, to: u8) {
        let Some(m) = core.membership() else {
            return;
        };
        if to != RUNNING {
            if let Some(g) = self.recs.get_mut(m.group) {
                g.members.unlink(&mut g.member_list, m.member());
                g.members.remove(m.member());
            }
        }
        self.each(m.group, |c| {
            let n = &mut c.counts;
            match from {
                QUEUED => n.queued -= 1,
                _ => n.running -= 1,
            }
            match to {
                RUNNING => n.running += 1,
                COMPLETED => n.completed += 1,
                PANICKED => n.panicked += 1,
                CANCELLED => n.cancelled += 1,
                UNSTARTED => n.unstarted += 1,
                SHED => n.shed += 1,
                _ => debug_assert!(false, "not a state a job moves to"),
            }
        });
    }

    /// The outcome of a job of group `key` was published: the group and its
    /// ancestors may be idle now (G3: the record may go).
    pub(crate) fn published(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.recs.get_mut(key) {
            g.own_pending -= 1;
        }
        self.each(key, |c| {
            c.pending -= 1;
            if c.pending == 0 {
                after.idle_groups.extend(c.idle_waiters.clone());
            }
        });
        self.free_unused(key, after);
    }

    /// Marks group `key` and its descendants closed: new jobs are refused.
    pub(crate) fn close(&mut self, key: Key) {
        for k in self.subtree(key) {
            if let Some(g) = self.recs.get_mut(k) {
                g.closed = true;
            }
        }
    }

    /// Marks group `key` and its descendants stopped (and closed), and
    /// returns the job-slab keys of their members (queued and running), for
    /// the stop transition (G2). `None` if the group was already stopped.
    pub(crate) fn stop(&mut self, key: Key) -> Option<Vec<Key>> {
        if self.recs.get(key).is_none_or(|g| g.stopped) {
            return None;
        }
        for k in self.subtree(key) {
            if let Some(g) = self.recs.get_mut(k) {
                g.stopped = true;
                g.closed = true;
            }
        }
        Some(self.members(key))
    }

    /// The job-slab keys of the members (queued and running) of group `key`
    /// and its descendants.
    pub(crate) fn members(&self, key: Key) -> Vec<Key> {
        let mut jobs = Vec::new();
        for k in self.subtree(key) {
            if let Some(g) = self.recs.get(k) {
                jobs.extend(g.members.iter(&g.member_list).copied());
            }
        }
        jobs
    }

    /// The wait list of group `key`'s idleness waiters (made on first use).
    pub(crate) fn wait_list(&mut self, key: Key) -> Option<std::sync::Arc<WaitList>> {
        let g = self.recs.get_mut(key)?;
        Some(g.idle_waiters.get_or_insert_with(Default::default).clone())
    }

    /// Every job of group `key` and its descendants is terminal and its
    /// outcome published.
    pub(crate) fn idle(&self, key: Key) -> bool {
        self.recs.get(key).is_none_or(|g| g.pending == 0)
    }

    /// Whether group `member` is group `key` or one of its descendants.
    pub(crate) fn within(&self, member: Key, key: Key) -> bool {
        let mut next = Some(member);
        while let Some(k) = next {
            if k == key {
                return true;
            }
            next = self.recs.get(k).and_then(|g| g.parent);
        }
        false
    }

    /// A snapshot of group `key`'s counts (G1).
    pub(crate) fn metrics(&self, key: Key) -> GroupMetrics {
        self.recs
            .get(key)
            .map(|g| GroupMetrics {
                stopped: g.stopped,
                closed: g.closed,
                ..g.counts
            })
            .unwrap_or_default()
    }

    /// Applies `f` to group `key` and each of its ancestors.
    fn each(&mut self, key: Key, mut f: impl FnMut(&mut GroupRec)) {
        let mut next = Some(key);
        while let Some(k) = next {
            let Some(g) = self.recs.get_mut(k) else {
                return;
            };
            f(g);
            next = g.parent;
        }
    }

    /// Group `key` and its descendants, parents before children.
    fn subtree(&self, key: Key) -> Vec<Key> {
        let mut out = vec![key];
        let mut i = 0;
        while let Some(&k) = out.get(i) {
            if let Some(g) = self.recs.get(k) {
                out.extend(self.recs.iter(&g.children).map(|c| c.key));
            }
            i += 1;
        }
        out
    }

    /// Runs `f` on the slab and group `parent`'s list of children (the list
    /// lives in the slab it links, so it is taken out meanwhile).
    fn with_children(&mut self, parent: Key, f: impl FnOnce(&mut Slab<GroupRec>, &mut List)) {
        let Some(mut list) = self.recs.get(parent).map(|p| p.children) else {
            return;
        };
        f(&mut self.recs, &mut list);
        if let Some(p) = self.recs.get_mut(parent) {
            p.children = list;
        }
    }

    /// Removes group `key`'s record, and then its parent's, and so on, while
    /// nothing refers to them any more (G3). O(1) per record. A record that
    /// only watches refer to stays, and its watches are woken to let go.
    fn free_unused(&mut self, key: Key, after: &mut After) {
        let mut next = Some(key);
        while let Some(k) = next {
            let Some(g) = self.recs.get(k).filter(|g| g.ended()) else {
                return;
            };
            if g.watches > 0 {
                after.idle_groups.extend(g.idle_waiters.clone());
                return;
            }
            next = self.recs.get(k).and_then(|g| g.parent);
            if let Some(p) = next {
                self.with_children(p, |recs, list| recs.unlink(list, k));
            }
            self.recs.remove(k);
        }
    }

    /// How many group records the pool keeps (G3).
    #[cfg(all(test, not(loom), feature = "tokio-util"))]
    pub(crate) fn len(&self) -> usize {
        self.recs.len()
    }
}

impl GroupRec {
    /// Nothing but watches refers to this record (G3).
    fn ended(&self) -> bool {
        self.handles == 0 && self.children.is_empty() && self.own_pending == 0
    }
}
