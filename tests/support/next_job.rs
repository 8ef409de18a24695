//! The job queued next, cancelled from foreign code (a waker, a drop, a
//! tracing subscriber) that runs on the worker as the job before it ends:
//! whether the cancel won and whether the job's function had begun.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

use offloader::{Error, Offloader};

/// Wakes by calling `on_wake`.
pub(crate) struct OnWake(pub(crate) Box<dyn Fn() + Send + Sync>);

impl Wake for OnWake {
    fn wake(self: Arc<Self>) {
        (self.0)();
    }
}

/// What a waker saw of the job queued next: whether its cancel won and
/// whether the job's function had begun.
#[derive(Clone, Default)]
pub(crate) struct NextJob {
    pub(crate) handle: Arc<Mutex<Option<offloader::JobHandle<()>>>>,
    pub(crate) begun: Arc<AtomicBool>,
    pub(crate) seen: Arc<Mutex<Option<(bool, bool)>>>,
}

impl NextJob {
    pub(crate) fn queue(&self, pool: &Offloader) {
        let begun = self.begun.clone();
        *self.handle.lock().expect("not poisoned") = Some(
            pool.offload(move |_| begun.store(true, Ordering::SeqCst))
                .spawn()
                .expect("room"),
        );
    }

    /// Cancels the job, recording (the first time) whether the cancel won
    /// and whether its function had begun.
    pub(crate) fn fire(&self) {
        if let Some(h) = self.handle.lock().expect("not poisoned").as_ref() {
            let begun = self.begun.load(Ordering::SeqCst);
            let won = h.cancel();
            self.seen
                .lock()
                .expect("not poisoned")
                .get_or_insert((won, begun));
        }
    }

    /// A waker that [`fire`](Self::fire)s.
    pub(crate) fn waker(&self) -> Waker {
        let me = self.clone();
        Waker::from(Arc::new(OnWake(Box::new(move || me.fire()))))
    }

    /// The cancel from the waker was refused while the function had not
    /// begun.
    pub(crate) fn refused_before_begun(&self) -> bool {
        *self.seen.lock().expect("not poisoned") == Some((false, false))
    }

    /// Waits for the job to end, its handle left in place for the waker
    /// until then; its outcome, if it was queued.
    pub(crate) fn wait(&self) -> Option<Result<(), Error>> {
        super::eventually_blocking("the next job ended", || {
            self.handle
                .lock()
                .expect("not poisoned")
                .as_ref()
                .is_none_or(|h| h.is_finished())
        });
        let h = self.handle.lock().expect("not poisoned").take();
        h.map(|mut h| h.blocking_wait(None))
    }
}
