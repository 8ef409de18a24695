//! `offload(f)`: the per-call builder, its submission (`spawn`, `submit`),
//! and `JobGroup::offload`. Awaiting it directly is `awaited.rs`.

use std::fmt;
use std::marker::PhantomData;
use std::pin::pin;
use std::time::{Duration, Instant};

use crate::util::clock::Began;

use crate::api::group::JobGroup;
use crate::api::handle::JobHandle;
use crate::core::pool::Offloader;
use crate::core::state::Wait;
use crate::core::waits::Waiting;
use crate::job::cell::Job;
use crate::job::error::{Error, SubmitError};
use crate::job::policy::AbandonPolicy;
use crate::job::record::{new_core, NewCore};
use crate::job::stop::StopToken;
use crate::util::sync::Arc;

/// One blocking function on its way into an [`Offloader`]: set a name, a
/// timeout, a deadline or an abandon policy, then either `.await` it or
/// [`spawn`](Self::spawn) it for an owner handle.
///
/// Created by [`Offloader::offload`] or the free function
/// [`offload`](crate::offload()).
///
/// Awaiting waits for room in the queue if it is full, then for the outcome.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use offloader::{AbandonPolicy, Offloader};
///
/// let pool = Offloader::builder().max_in_flight(2).build()?;
/// let len = pool
///     .offload(|_stop| std::fs::read_dir(".").map(|d| d.count()))
///     .name("list")
///     .with_timeout(Duration::from_secs(5))
///     .on_abandon(AbandonPolicy::CancelAndStop)
///     .await??;
/// assert!(len > 0);
/// # Ok(()) }
/// ```
#[must_use = "an offload does nothing until it is awaited or spawned"]
pub struct Offload<F, T> {
    pub(crate) pool: Offloader,
    func: F,
    pub(crate) opts: Options,
    _result: PhantomData<fn() -> T>,
}

/// Everything an [`Offload`] carries besides its pool and function.
#[derive(Default)]
pub(crate) struct Options {
    name: Option<std::sync::Arc<str>>,
    pub(crate) timeout: Option<Duration>,
    deadline: Option<Instant>,
    pub(crate) policy: Option<AbandonPolicy>,
    group: Option<JobGroup>,
    key: Option<crate::job::lane::LaneKey>,
    limiters: crate::job::limiter::Limiters,
    /// Whether an awaiting caller may spin briefly for a short job's outcome
    /// (not for the jobs of a batch: they are awaited together).
    pub(crate) no_spin: bool,
    /// A token whose cancellation cancels or stops the job, and one that is
    /// cancelled when the job's function is gone (run or dropped).
    #[cfg(feature = "tokio-util")]
    follow: Option<crate::api::interop::Follow>,
}

impl Options {
    /// Whether the job follows a token cancelled already.
    fn follows_cancelled(&self) -> bool {
        #[cfg(feature = "tokio-util")]
        return self
            .follow
            .as_ref()
            .is_some_and(crate::api::interop::Follow::is_cancelled);
        #[cfg(not(feature = "tokio-util"))]
        false
    }
}

/// The entry point lives here, with the [`Offload`] it makes: the pool
/// module stays below this one.
impl Offloader {
    /// Prepares `f` to run on this pool.
    ///
    /// Await the result to run it and wait for its outcome, or call
    /// [`Offload::spawn`] to get an owner handle.
    ///
    /// `f` receives the job's [`StopToken`].
    pub fn offload<F, T>(&self, f: F) -> Offload<F, T>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        Offload::new(self.clone(), f)
    }
}

impl JobGroup {
    /// Prepares `f` to run on the group's pool as a job of this group.
    ///
    /// As [`Offloader::offload`], and the group's [`stop`](JobGroup::stop),
    /// [`idle`](JobGroup::idle), [`close`](JobGroup::close) and
    /// [`metrics`](JobGroup::metrics) include it.
    ///
    /// Refused with [`Error::Cancelled`] (`id: None`) once the group is stopped
    /// or closing.
    pub fn offload<F, T>(&self, f: F) -> Offload<F, T>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut offload = Offload::new(self.pool.clone(), f);
        offload.opts.group = Some(self.clone());
        offload
    }
}

impl<F, T> Offload<F, T> {
    /// An offload of `func` on `pool` with `opts` (also: the same options
    /// around another function).
    fn with_options(pool: Offloader, func: F, opts: Options) -> Self {
        Offload {
            pool,
            func,
            opts,
            _result: PhantomData,
        }
    }
}

impl<F, T> Offload<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn new(pool: Offloader, func: F) -> Self {
        Offload::with_options(pool, func, Options::default())
    }

    /// Makes the job follow `token` (feature `tokio-util`), so that a tree of
    /// async cancellation reaches this one blocking job.
    ///
    /// Call it once per token: the job follows each, and the first one
    /// cancelled acts, by when it is cancelled:
    ///
    /// - **before `spawn` or `submit` is called, or while its caller waits
    ///   for room:** it never runs (a cancel racing the call itself may
    ///   land after its check, and then counts as one of the cases below). It is
    ///   accepted and cancelled at once, taking no place in the queue, or
    ///   refused ([`Error::ObserverBehind`]) if an observer's lag holds
    ///   admission back; a caller waiting for room stops waiting;
    /// - **while it is queued:** it is cancelled shortly after, never run;
    /// - **as it starts** (a worker takes it before the watch acts): it runs
    ///   with its stop token set, at once or just after;
    /// - **while it runs:** its stop token is set and its
    ///   [`on_stop`](StopToken::on_stop) callbacks run; it keeps its permit
    ///   until it returns;
    /// - **after its function has run or been dropped:** nothing.
    ///
    /// Dropping the job's handle changes none of this. Where the watch and
    /// its stop run: [`JobGroup::stop_on`]. A refused offload hands back
    /// the function itself ([`SubmitError::into_inner`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio_util::sync::CancellationToken;
    /// let pool = offloader::Offloader::builder().build()?;
    /// let (request, server) = (CancellationToken::new(), CancellationToken::new());
    /// let job = pool
    ///     .offload(|stop| stop.sleep(std::time::Duration::from_secs(60)))
    ///     .stop_on(request.clone())
    ///     .stop_on(server.clone())
    ///     .spawn()?;
    /// request.cancel();
    /// match job.await {
    ///     Err(e) if e.is_cancelled() => {} // still queued: it never ran
    ///     Ok(slept) => assert!(slept.is_err()), // its sleep saw the stop
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tokio-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio-util")))]
    pub fn stop_on(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        crate::api::interop::Follow::add(&mut self.opts.follow, token);
        self
    }

    /// An awaiting caller does not spin for the outcome (batch calls).
    pub(crate) fn without_spin(mut self) -> Self {
        self.opts.no_spin = true;
        self
    }

    /// Names the job, for tracing spans, errors and reports.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.opts.name = Some(name.into().into());
        self
    }

    /// Bounds how long the caller waits for the outcome, counted from when
    /// the future is created (waiting for queue room included).
    ///
    /// When it passes, the wait ends with [`Error::TimedOut`] and the job
    /// follows the abandon policy. The function sees the resulting instant
    /// as its [`StopToken::deadline`]. On a [`spawn`](Self::spawn)ed or
    /// [`submit`](Self::submit)ted handle it bounds the handle's awaits
    /// (`.await`, not [`blocking_wait`](crate::JobHandle::blocking_wait),
    /// which takes its own limit), counted from the
    /// `spawn` or `submit`, until it has passed once: then, as for an
    /// awaited offload, the job follows its abandon policy (an await begun
    /// after it passed times out at the timer's next tick, unless the
    /// outcome is ready by then; the handle's later awaits wait without a
    /// limit).
    ///
    /// Under a policy that cancels, the pool also refuses or sheds the job
    /// when it cannot finish before this deadline ([`Error::Overloaded`]:
    /// the guide's "Sizing and overload").
    ///
    /// Needs a tokio runtime with the time driver when awaited.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.opts.timeout = Some(limit);
        self
    }

    /// A deadline for the job itself, shown to the function as
    /// [`StopToken::deadline`].
    ///
    /// The function sees the earlier of this and the caller's timeout: a
    /// request's deadline carried into its blocking work, without bounding
    /// anyone's wait (that is [`with_timeout`](Self::with_timeout)).
    ///
    /// The function decides what to do with it once it runs; before that, under
    /// an abandon policy that cancels, the pool refuses or sheds a job that
    /// cannot finish by it ([`Error::Overloaded`]: the guide's "Sizing and
    /// overload").
    pub fn deadline(mut self, at: Instant) -> Self {
        self.opts.deadline = Some(at);
        self
    }

    /// Puts the job in `key`'s lane, so that one key's burst cannot hold back
    /// another key's jobs.
    ///
    /// At most [`Builder::max_per_key`](crate::Builder::max_per_key) (or the
    /// key's [`key_limit`](crate::Builder::key_limit)) jobs of one key run at
    /// once, and the pool serves the keys with a startable job in turn: one
    /// key's burst holds back another key's job by at most one turn.
    ///
    /// Jobs of one key start in submission order; a job waiting for its lane is
    /// queued (and cancellable) like any other.
    pub fn key(mut self, key: impl Into<crate::job::lane::LaneKey>) -> Self {
        self.opts.key = Some(key.into());
        self
    }

    /// Makes the job hold a permit of `limiter` for as long as its function
    /// runs.
    ///
    /// The permit is taken together with its pool permit (and with those of its
    /// other limiters: call this once per limiter) and given back together with
    /// it when the function returns or unwinds, never with the caller's timeout
    /// or drop.
    ///
    /// A job waiting for a limiter is queued and cancellable like any other,
    /// and holds back no job of another lane; unkeyed jobs with the same
    /// limiters share a lane, in submission order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let writer = offloader::Limiter::new(1); // one writer at a time
    /// let pool = offloader::Offloader::builder().max_in_flight(8).build()?;
    /// let n = pool.offload(|_stop| 1).limiter(&writer).await?;
    /// assert_eq!((n, writer.stats().in_use), (1, 0));
    /// # Ok(()) }
    /// ```
    pub fn limiter(mut self, limiter: &crate::job::limiter::Limiter) -> Self {
        self.opts.limiters.push(limiter.clone());
        self
    }

    /// Overrides the pool's [`AbandonPolicy`] for this call.
    pub fn on_abandon(mut self, policy: AbandonPolicy) -> Self {
        self.opts.policy = Some(policy);
        self
    }

    /// Submits the job without waiting and returns its owner handle.
    ///
    /// Fails at once, handing the function back, if the queue is full, the
    /// offloader is shutting down, no worker thread could be spawned, or
    /// the job cannot finish before its deadline ([`Error::Overloaded`]).
    /// Dropping the handle applies the job's abandon policy
    /// ([`JobHandle`]'s docs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().build()?;
    /// let job = pool.offload(|_stop| 1 + 1).name("sum").spawn()?;
    /// assert_eq!(job.name(), Some("sum"));
    /// assert_eq!(job.await?, 2);
    /// # Ok(()) }
    /// ```
    pub fn spawn(self) -> Result<JobHandle<T>, SubmitError<F>> {
        let limit = self.opts.timeout;
        let began = Began::if_limited(limit);
        match self.try_accept(began) {
            Ok(handle) => Ok(handle.with_wait_limit(began, limit)),
            Err((reason, back)) => {
                back.pool.inner().count_refusal(&reason);
                Err(SubmitError::new(reason, back.func))
            }
        }
    }

    /// Submits the job once the queue has room, waiting for it, and returns its
    /// owner handle.
    ///
    /// Fails, handing the function back, if the offloader shuts down first, no
    /// worker thread could be spawned, or the caller's
    /// [`with_timeout`](Self::with_timeout) passes while it waits for room
    /// ([`Error::TimedOut`], `id: None`): the wait for room counts against the
    /// timeout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().queue_capacity(1).build()?;
    /// let job = pool.offload(|_stop| "ok").submit().await?;
    /// assert_eq!(job.await?, "ok");
    /// # Ok(()) }
    /// ```
    pub async fn submit(self) -> Result<JobHandle<T>, SubmitError<F>> {
        let limit = self.opts.timeout;
        let began = Began::if_limited(limit);
        let handle = self.submit_from(began).await?;
        Ok(handle.with_wait_limit(began, limit))
    }

    /// [`submit`](Self::submit), with the caller's wait for room counted
    /// from `began`; the handle has no wait limit of its own (a directly
    /// awaited offload keeps its timer).
    pub(crate) async fn submit_from(self, began: Began) -> Result<JobHandle<T>, SubmitError<F>> {
        let inner = self.pool.inner().clone();
        let limit = self.opts.timeout;
        // Counted so that freed slots signal it ([`State::room_freed`]).
        let _counted = Waiting::new(&inner, Wait::Room);
        // Counted once refused, if the job needs no limiter and has no key
        // (a key at its limit would hold it back too): a free permit with
        // the bound full then signals every waiter (admission.rs
        // `room_for_jobs_starting_at_once`), this one among them.
        let mut plain = None;
        let wait_until = limit.map(|limit| began.timer_deadline(limit));
        // Under a paused test clock, a timed wait for room (for running jobs
        // to finish) holds the clock as long as it lasts; set up at the
        // first wait.
        let mut hold = None;
        // Stands in for the caller's waker in the `Notify` (made at the
        // first wait): see `wait_list::Relay`.
        let mut relay = None;
        // A job that follows tokens stops waiting for room when one is
        // cancelled: it is then accepted and cancelled at once, without a
        // place (admission.rs `reserve`), or refused for the observer's lag.
        #[cfg(feature = "tokio-util")]
        let follows = crate::api::interop::Follow::tokens(self.opts.follow.as_ref());
        let mut this = self;
        loop {
            // Registered before trying, so that a slot freed in between
            // wakes this wait ([`State::room_freed`]).
            let mut freed = pin!(inner.room_freed.notified());
            freed.as_mut().enable();
            match this.try_accept(began) {
                Ok(handle) => return Ok(handle),
                // The observer itself cannot wait for its own lag to drop,
                // nor a job whose token is cancelled (it takes no place, so
                // only the lag holds it back, and its wait would end at
                // once, to retry without end).
                Err((reason @ Error::ObserverBehind { .. }, back))
                    if inner.is_delivery_thread() || back.opts.follows_cancelled() =>
                {
                    inner.count_refusal(&reason);
                    return Err(SubmitError::new(reason, back.func));
                }
                // Room, or the observer catching up, frees a slot.
                Err((Error::Full { .. } | Error::ObserverBehind { .. }, back)) => {
                    this = back;
                    if plain.is_none() && this.opts.limiters.is_empty() && this.opts.key.is_none() {
                        // Tries again once counted: a free permit signalled
                        // in between is not missed.
                        plain = Some(Waiting::new(&inner, Wait::RoomPlain));
                        continue;
                    }
                }
                Err((reason, back)) => {
                    inner.count_refusal(&reason);
                    return Err(SubmitError::new(reason, back.func));
                }
            }
            let relay = relay.get_or_insert_with(std::sync::Arc::default);
            let freed = crate::util::wait_list::Relayed::new(freed, relay);
            #[cfg(feature = "tokio-util")]
            let freed = crate::api::interop::or_cancelled(freed, &follows);
            match wait_until {
                None => freed.await,
                Some(at) => {
                    if hold.is_none() {
                        hold = Some(inner.clock_holds.hold());
                    }
                    if tokio::time::timeout_at(at, freed).await.is_err() {
                        let reason = inner.gave_up_waiting(began.waited());
                        return Err(SubmitError::new(reason, this.func));
                    }
                }
            }
        }
    }

    /// One attempt: enqueues the job if there is room; otherwise hands the
    /// offload back, unchanged but for a spent job id.
    // The refusal hands the whole offload back for the next try; boxing it
    // would allocate on every retry of a caller waiting for room.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_accept(self, began: Began) -> Result<JobHandle<T>, (Error, Self)> {
        // The function's deadline is in real time: it runs on real threads.
        let wait_until = self
            .opts
            .timeout
            .and_then(|t| began.real().and_then(|r| r.checked_add(t)));
        let deadline = match (wait_until, self.opts.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut opts = self.opts;
        let policy = opts.policy.unwrap_or(self.pool.inner().config.abandon);
        let group = opts.group.as_ref().map(JobGroup::key);
        // Beside the function, not around it: a refusal hands back the
        // caller's own function.
        #[cfg(feature = "tokio-util")]
        let gone = opts
            .follow
            .as_mut()
            .map(crate::api::interop::Follow::attempt);
        #[cfg(not(feature = "tokio-util"))]
        let gone = None;
        // The job takes its name, key and limiters (no clone per job: a
        // refusal gives them back below).
        let core = new_core(
            crate::job::id::JobId::next(),
            opts.name.take(),
            deadline,
            group,
            opts.key.take(),
            std::mem::take(&mut opts.limiters),
            gone,
        );
        let (pool, func) = (self.pool, self.func);
        match core {
            NewCore::Plain(core) => accept(Arc::new(Job::new(core, func)), pool, opts, policy),
            NewCore::WithExtras(core) => accept(Arc::new(Job::new(core, func)), pool, opts, policy),
        }
    }
}

/// The rest of [`Offload::try_accept`], for a job of either layout.
#[allow(clippy::result_large_err)]
fn accept<F, T, const N: usize>(
    job: Arc<Job<F, T, N>>,
    pool: Offloader,
    mut opts: Options,
    policy: AbandonPolicy,
) -> Result<JobHandle<T>, (Error, Offload<F, T>)>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    let inner = pool.inner().clone();
    // Before the job is shared: what its owner's leaving does, and whether
    // the pool may shed it (state/overload.rs).
    crate::job::cell::Task::core(&*job).set_leave_policy(policy);
    // A job that follows a token cancelled already is cancelled in the
    // critical section that accepts it: a worker could start it before
    // the watch below could cancel it.
    if let Err((reason, func)) = inner.submit(&job, opts.follows_cancelled()) {
        let core = crate::job::cell::Task::core(&*job);
        opts.name = core.name().cloned();
        opts.key = core.lane_key().cloned();
        opts.limiters = core.limiters().into();
        return Err((reason, Offload::with_options(pool, func, opts)));
    }
    #[cfg(feature = "tokio-util")]
    if let Some(follow) = opts.follow {
        let task: Arc<dyn crate::job::cell::Task> = job.clone();
        follow.watch(&task, &inner);
    }
    Ok(JobHandle::new(job, inner))
}

impl<F, T> fmt::Debug for Offload<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offload")
            .field("name", &self.opts.name)
            .field("timeout", &self.opts.timeout)
            .field("deadline", &self.opts.deadline)
            .field("policy", &self.opts.policy)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
impl crate::job::record::NewCore {
    /// The job of `func` with this core, as the pool sees it.
    pub(crate) fn into_task<F, T>(self, func: F) -> Arc<dyn crate::job::cell::Task>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        match self {
            crate::job::record::NewCore::Plain(core) => Arc::new(Job::new(core, func)),
            crate::job::record::NewCore::WithExtras(core) => Arc::new(Job::new(core, func)),
        }
    }
}
