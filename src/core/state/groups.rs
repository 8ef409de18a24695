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

use super::{After, Room, State};
use crate::core::metrics::GroupMetrics;
use crate::core::report::RunningJob;
use crate::job::cell::Task;
use crate::job::error::Error;
use crate::job::id::{CANCELLED, COMPLETED, PANICKED, QUEUED, RUNNING, SHED, UNSTARTED};
use crate::job::record::JobCore;
use crate::util::slab::{Key, List, Slab};
use crate::util::sync::Arc;
use crate::util::wait_list::WaitList;

/// What a group stop leaves to do after unlocking.
#[derive(Default)]
pub(crate) struct StoppedJobs {
    /// Jobs it cancelled: their functions are discarded after unlocking.
    pub(crate) cancelled: Vec<Arc<dyn Task>>,
    /// Jobs running now whose stop flag it set: their stop callbacks run
    /// after unlocking.
    pub(crate) running: Vec<Arc<dyn Task>>,
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

impl State {
    /// Creates a group (a child of `parent`, if given) with one handle.
    /// A child of a stopped or closed group is born so.
    pub(crate) fn group_create(&mut self, parent: Option<Key>) -> Key {
        let (stopped, closed) = parent
            .and_then(|p| self.groups.get(p))
            .map_or((false, false), |p| (p.stopped, p.closed));
        let key = self.groups.insert(GroupRec {
            parent,
            handles: 1,
            stopped,
            closed,
            ..GroupRec::default()
        });
        if let Some(g) = self.groups.get_mut(key) {
            g.key = key;
        }
        if let Some(p) = parent {
            self.with_children(p, |groups, list| groups.push_back(list, key));
        }
        key
    }

    /// A handle to group `key` was dropped.
    pub(crate) fn group_handle_dropped(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.groups.get_mut(key) {
            g.handles -= 1;
        }
        self.group_free_unused(key, after);
    }

    /// A `stop_on` watch follows group `key` from now until
    /// [`group_unwatch`](Self::group_unwatch): the record stays (G3).
    /// Returns the list that wakes the watch when the group has ended.
    #[cfg(feature = "tokio-util")]
    pub(crate) fn group_watch(&mut self, key: Key) -> Option<std::sync::Arc<WaitList>> {
        let g = self.groups.get_mut(key)?;
        g.watches += 1;
        Some(g.idle_waiters.get_or_insert_with(Default::default).clone())
    }

    /// A watch of group `key` lets go of its record.
    #[cfg(feature = "tokio-util")]
    pub(crate) fn group_unwatch(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.groups.get_mut(key) {
            g.watches -= 1;
        }
        self.group_free_unused(key, after);
    }

    /// Whether group `key` has ended: nothing but watches refers to its
    /// record (no handle, no child, no own job unpublished), so nothing of
    /// it is left to stop (G3).
    #[cfg(feature = "tokio-util")]
    pub(crate) fn group_ended(&self, key: Key) -> bool {
        self.groups.get(key).is_none_or(GroupRec::ended)
    }

    /// Whether a job offloaded through its group may join it: refused if
    /// the group is stopped (G2).
    pub(crate) fn group_admits(&mut self, core: &JobCore) -> Result<(), Error> {
        let Some(m) = core.membership() else {
            return Ok(());
        };
        if !self.groups.get(m.group).is_some_and(|g| g.closed) {
            return Ok(());
        }
        self.each_group(m.group, |c| c.counts.rejected += 1);
        Err(Error::Cancelled { id: None })
    }

    /// Part of *accept*: the job `job` (key in the job slab) joins its
    /// group, if it has one (G4), and is counted there and above.
    pub(super) fn group_join(&mut self, core: &JobCore, job: Key) {
        let Some(m) = core.membership() else {
            return;
        };
        let Some(g) = self.groups.get_mut(m.group) else {
            return;
        };
        let member = g.members.insert(job);
        g.members.push_back(&mut g.member_list, member);
        m.set_member(member);
        g.own_pending += 1;
        self.each_group(m.group, |c| {
            c.counts.accepted += 1;
            c.counts.queued += 1;
            c.pending += 1;
        });
    }

    /// Part of a job transition from `from` to `to` (state words): moves
    /// the job's counts in its group and above (G1); a terminal job leaves
    /// its group's members (G4).
    pub(super) fn group_moved(&mut self, core: &JobCore, from: u8, to: u8) {
        let Some(m) = core.membership() else {
            return;
        };
        if to != RUNNING {
            if let Some(g) = self.groups.get_mut(m.group) {
                g.members.unlink(&mut g.member_list, m.member());
                g.members.remove(m.member());
            }
        }
        self.each_group(m.group, |c| {
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
    pub(crate) fn group_published(&mut self, key: Key, after: &mut After) {
        if let Some(g) = self.groups.get_mut(key) {
            g.own_pending -= 1;
        }
        self.each_group(key, |c| {
            c.pending -= 1;
            if c.pending == 0 {
                after.idle_groups.extend(c.idle_waiters.clone());
            }
        });
        self.group_free_unused(key, after);
    }

    /// Marks group `key` and its descendants closed: new jobs are refused.
    pub(crate) fn group_close(&mut self, key: Key, after: &mut After) {
        for k in self.subtree(key) {
            if let Some(g) = self.groups.get_mut(k) {
                g.closed = true;
            }
        }
        self.group_refuses_from_now(after);
    }

    /// A group stopped or closed: callers waiting for room with a job of it
    /// learn that it is refused now, not when room frees (which may be
    /// never), as at a shutdown. The others look again and wait on.
    fn group_refuses_from_now(&self, after: &mut After) {
        if self.waiters.for_room() {
            after.room = Room::All;
        }
    }

    /// The wait list of group `key`'s idleness waiters (made on first use).
    pub(crate) fn group_wait_list(&mut self, key: Key) -> Option<std::sync::Arc<WaitList>> {
        let g = self.groups.get_mut(key)?;
        Some(g.idle_waiters.get_or_insert_with(Default::default).clone())
    }

    /// Marks group `key` and its descendants stopped (and closed), cancels
    /// their queued jobs (transition *cancel-queued*) and sets the stop
    /// flag of their running ones, all in this one critical section: none
    /// of the queued ones starts after the stop, and every running one is
    /// stopped at once. Returns both, for the work after unlocking
    /// (discarding functions, running stop callbacks) (G2). `None` if the
    /// group was already stopped.
    pub(crate) fn group_stop(&mut self, key: Key, after: &mut After) -> Option<StoppedJobs> {
        if self.groups.get(key).is_none_or(|g| g.stopped) {
            return None;
        }
        let mut jobs = Vec::new();
        self.group_refuses_from_now(after);
        for k in self.subtree(key) {
            let Some(g) = self.groups.get_mut(k) else {
                continue;
            };
            g.stopped = true;
            g.closed = true;
            for &job in g.members.iter(&g.member_list) {
                if let Some(task) = self.jobs.get(job) {
                    jobs.push(task.clone());
                }
            }
        }
        let mut stopped = StoppedJobs::default();
        for task in jobs {
            if self.cancel_queued(task.core(), after) {
                stopped.cancelled.push(task);
            } else if crate::job::stop::mark_stopped(&*task) {
                // Every running job's flag in this one critical section: no
                // job freed by an earlier one's stop meets a later one still
                // unstopped. The callbacks run after unlocking.
                self.stop_requested();
                stopped.running.push(task);
            }
        }
        Some(stopped)
    }

    /// Every job of group `key` and its descendants is terminal and its
    /// outcome published.
    pub(crate) fn group_idle(&self, key: Key) -> bool {
        self.groups.get(key).is_none_or(|g| g.pending == 0)
    }

    /// Whether the job of slab key `job` (queued or running) belongs to
    /// group `key` or one of its descendants.
    pub(crate) fn job_in_group(&self, job: Key, key: Key) -> bool {
        let Some(member) = self
            .jobs
            .get(job)
            .and_then(|t| t.core().membership().map(|m| m.group))
        else {
            return false;
        };
        let mut next = Some(member);
        while let Some(k) = next {
            if k == key {
                return true;
            }
            next = self.groups.get(k).and_then(|g| g.parent);
        }
        false
    }

    /// A snapshot of group `key`'s counts (G1).
    pub(crate) fn group_metrics(&self, key: Key) -> GroupMetrics {
        self.groups
            .get(key)
            .map(|g| GroupMetrics {
                stopped: g.stopped,
                closed: g.closed,
                ..g.counts
            })
            .unwrap_or_default()
    }

    /// The running jobs of group `key` and its descendants.
    pub(crate) fn group_running_jobs(&self, key: Key) -> Vec<RunningJob> {
        let mut out = Vec::new();
        for k in self.subtree(key) {
            let Some(g) = self.groups.get(k) else {
                continue;
            };
            for &job in g.members.iter(&g.member_list) {
                if let Some(task) = self.jobs.get(job) {
                    if task.core().state_word() == RUNNING {
                        out.push(RunningJob::of(task.core()));
                    }
                }
            }
        }
        out
    }

    /// Applies `f` to group `key` and each of its ancestors.
    fn each_group(&mut self, key: Key, mut f: impl FnMut(&mut GroupRec)) {
        let mut next = Some(key);
        while let Some(k) = next {
            let Some(g) = self.groups.get_mut(k) else {
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
            if let Some(g) = self.groups.get(k) {
                out.extend(self.groups.iter(&g.children).map(|c| c.key));
            }
            i += 1;
        }
        out
    }

    /// Runs `f` on the slab and group `parent`'s list of children (the list
    /// lives in the slab it links, so it is taken out meanwhile).
    fn with_children(&mut self, parent: Key, f: impl FnOnce(&mut Slab<GroupRec>, &mut List)) {
        let Some(mut list) = self.groups.get(parent).map(|p| p.children) else {
            return;
        };
        f(&mut self.groups, &mut list);
        if let Some(p) = self.groups.get_mut(parent) {
            p.children = list;
        }
    }

    /// Removes group `key`'s record, and then its parent's, and so on, while
    /// nothing refers to them any more (G3). O(1) per record. A record that
    /// only watches refer to stays, and its watches are woken to let go.
    fn group_free_unused(&mut self, key: Key, after: &mut After) {
        let mut next = Some(key);
        while let Some(k) = next {
            let Some(g) = self.groups.get(k).filter(|g| g.ended()) else {
                return;
            };
            if g.watches > 0 {
                after.idle_groups.extend(g.idle_waiters.clone());
                return;
            }
            next = self.groups.get(k).and_then(|g| g.parent);
            if let Some(p) = next {
                self.with_children(p, |groups, list| groups.unlink(list, k));
            }
            self.groups.remove(k);
        }
    }
}

impl GroupRec {
    /// Nothing but watches refers to this record (G3).
    fn ended(&self) -> bool {
        self.handles == 0 && self.children.is_empty() && self.own_pending == 0
    }
}

#[cfg(all(test, not(loom), feature = "tokio-util"))]
impl State {
    /// How many group records the pool keeps (G3).
    pub(crate) fn groups_len(&self) -> usize {
        self.groups.len()
    }
}
