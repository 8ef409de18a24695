//! Batch calls: `invoke_all` (every outcome, in order) and `invoke_any`
//! (the first success wins; the losers are cancelled or stopped). Each job
//! of a batch is an ordinary offload: the same permits, timeouts and
//! abandon policies.

use std::fmt;
use std::future::{poll_fn, Future, IntoFuture};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::api::awaited::OffloadFuture;
use crate::api::group::JobGroup;
use crate::api::offload::Offload;
use crate::core::pool::Offloader;
use crate::job::error::Error;
use crate::job::policy::{AbandonPolicy, Departure, GroupDropPolicy};
use crate::job::stop::StopToken;
use crate::util::clock::Began;
use crate::util::ready::ReadySet;

/// Why one job of a batch gave no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError<E> {
    /// The function ran and returned this error.
    #[error("the function failed: {0}")]
    Failed(E),
    /// The job gave no outcome of its own: refused, cancelled, panicked,
    /// timed out (see [`Error`]).
    #[error(transparent)]
    Job(#[from] Error),
}

/// Why an [`invoke_any`](Offloader::invoke_any) has no winner: every job
/// failed, and here is each one's error.
///
/// One error type, so that the race works with `?`.
///
/// Its message counts the failures and quotes the first job's error once
/// ("all 3 jobs failed; job 0: the function failed: timed out"); the others
/// are in [`errors`](AllFailed::errors). It is an [`std::error::Error`]
/// when `E` is `Debug + Display` (a `String` will do), and
/// `Send + Sync + 'static` when `E` is: `?` converts it into
/// `Box<dyn Error + Send + Sync>` or `anyhow::Error`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use offloader::{BatchError, StopToken};
///
/// let pool = offloader::Offloader::builder().build()?;
/// let mirrors = ["a", "b"].map(|m| move |_: &StopToken| Err::<(), _>(format!("{m} is down")));
/// let failed = pool.invoke_any(mirrors).await.unwrap_err();
/// assert_eq!(failed.to_string(), "all 2 jobs failed; job 0: the function failed: a is down");
/// assert!(matches!(&failed.errors[1], BatchError::Failed(e) if e == "b is down"));
/// # Ok(()) }
/// ```
// Display and Error by hand, not through thiserror: the message is
// computed from the list, and thiserror cannot put the `E: Display` bound
// that needs on its impl alone (only on the struct, where every user of
// `AllFailed<E>` would carry it).
#[derive(Debug)]
#[non_exhaustive]
pub struct AllFailed<E> {
    /// Every job's error, in input order: `errors[i]` is job `i`'s.
    ///
    /// Empty when the race had no job.
    pub errors: Vec<BatchError<E>>,
}

impl<E: fmt::Display> fmt::Display for AllFailed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.errors.as_slice() {
            [] => f.write_str("no job to run"),
            [only] => write!(f, "the only job failed: {only}"),
            [first, ..] => write!(f, "all {} jobs failed; job 0: {first}", self.errors.len()),
        }
    }
}

/// No [`source`](std::error::Error::source): the message quotes the first
/// job's error already, and a chain of one of several errors would say it
/// twice.
impl<E: fmt::Debug + fmt::Display> std::error::Error for AllFailed<E> {}

/// Where a batch's jobs go: a pool or a group.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Pool(Offloader),
    Group(JobGroup),
}

impl Target {
    pub(crate) fn offload<F, T>(&self, f: F) -> Offload<F, T>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        match self {
            Target::Pool(p) => p.offload(f),
            Target::Group(g) => g.offload(f),
        }
    }

    /// A new group for one batch: a child of the target's group, or a group
    /// of the target's pool.
    pub(crate) fn group(&self) -> JobGroup {
        match self {
            Target::Pool(p) => p.group(),
            Target::Group(g) => g.child(),
        }
    }
}

impl Offloader {
    /// Runs every function of `fs` on this pool and returns each outcome, in
    /// input order, once all are terminal (or the timeout passed: see
    /// [`InvokeAll::with_timeout`]).
    ///
    /// Like Java's `invokeAll`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().max_in_flight(2).build()?;
    /// let fs: Vec<_> = (1..=3).map(|i| move |_: &offloader::StopToken| i * 10).collect();
    /// let outcomes = pool.invoke_all(fs).await;
    /// let values: Vec<i32> = outcomes.into_iter().collect::<Result<_, _>>()?;
    /// assert_eq!(values, [10, 20, 30]);
    /// # Ok(()) }
    /// ```
    pub fn invoke_all<I, F, T>(&self, fs: I) -> InvokeAll<F>
    where
        I: IntoIterator<Item = F>,
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        InvokeAll::new(Target::Pool(self.clone()), fs)
    }

    /// Runs every function of `fs` on this pool; the first to return `Ok` wins
    /// and its index and value are returned.
    ///
    /// The losers are cancelled if still queued and stopped if running (their
    /// stop tokens are set); each keeps its permit until its function really
    /// returns. If every function fails, the error is [`AllFailed`], with every
    /// job's error in input order (an empty `fs` gives an empty list). Like
    /// Java's `invokeAny`, with losers that are told to stop through their
    /// token.
    ///
    /// The jobs run in a group of their own: dropping this future before it
    /// finishes stops them all. A queued loser may start in the instant
    /// between the winner's return and the stop (the winner's worker takes
    /// the next job as it finishes); it then runs with its stop token set.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().max_in_flight(3).build()?;
    /// let mirrors = [0u64, 50, 100].map(|delay| {
    ///     move |stop: &offloader::StopToken| -> Result<u64, String> {
    ///         stop.sleep(Duration::from_secs(delay)).map_err(|e| e.to_string())?;
    ///         Ok(delay)
    ///     }
    /// });
    /// let (winner, value) = pool.invoke_any(mirrors).await?;
    /// assert_eq!((winner, value), (0, 0)); // the others were stopped at once
    /// # Ok(()) }
    /// ```
    pub fn invoke_any<I, F, T, E>(&self, fs: I) -> InvokeAny<F>
    where
        I: IntoIterator<Item = F>,
        F: FnOnce(&StopToken) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        InvokeAny::new(Target::Pool(self.clone()), fs)
    }
}

impl JobGroup {
    /// [`Offloader::invoke_all`] with every job in this group.
    pub fn invoke_all<I, F, T>(&self, fs: I) -> InvokeAll<F>
    where
        I: IntoIterator<Item = F>,
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        InvokeAll::new(Target::Group(self.clone()), fs)
    }

    /// [`Offloader::invoke_any`] with every job in a new child of this
    /// group (stopping this group stops the race too).
    pub fn invoke_any<I, F, T, E>(&self, fs: I) -> InvokeAny<F>
    where
        I: IntoIterator<Item = F>,
        F: FnOnce(&StopToken) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        InvokeAny::new(Target::Group(self.clone()), fs)
    }
}

/// A race of functions on their way into a pool, from
/// [`Offloader::invoke_any`] or [`JobGroup::invoke_any`]: await it for the
/// first success (its index and value), or for every error ([`AllFailed`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = offloader::Offloader::builder().max_in_flight(4).build()?;
/// let replica = offloader::Limiter::new(1); // one call to the replica at a time
/// let calls = [1, 2, 3].map(|n| move |_: &offloader::StopToken| Ok::<_, String>(n));
/// let (winner, value) = pool
///     .invoke_any(calls)
///     .key("replica-a")
///     .limiter(&replica)
///     .await?;
/// assert_eq!((winner, value), (0, 1)); // the limiter lets them run one by one
/// assert_eq!(replica.stats().high_water, 1);
/// # Ok(()) }
/// ```
#[must_use = "a race does nothing until it is awaited"]
pub struct InvokeAny<F> {
    target: Target,
    fs: Vec<F>,
    lanes: BatchLanes,
}

impl<F> InvokeAny<F> {
    fn new(target: Target, fs: impl IntoIterator<Item = F>) -> Self {
        InvokeAny {
            target,
            fs: fs.into_iter().collect(),
            lanes: BatchLanes::default(),
        }
    }

    lane_methods!("race");
}

impl<F, T, E> IntoFuture for InvokeAny<F>
where
    F: FnOnce(&StopToken) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    type Output = Result<(usize, T), AllFailed<E>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        let InvokeAny { target, fs, lanes } = self;
        Box::pin(async move { invoke_any(&target, fs, &lanes).await })
    }
}

impl<F> fmt::Debug for InvokeAny<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InvokeAny")
            .field("jobs", &self.fs.len())
            .finish_non_exhaustive()
    }
}

async fn invoke_any<F, T, E>(
    target: &Target,
    fs: Vec<F>,
    lanes: &BatchLanes,
) -> Result<(usize, T), AllFailed<E>>
where
    F: FnOnce(&StopToken) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    // Dropping this future drops the group's last handle: its jobs stop.
    let group = target.group().on_drop(GroupDropPolicy::Stop);
    let mut set = ReadySet::new();
    let mut errors = Vec::new();
    for (i, f) in fs.into_iter().enumerate() {
        set.push(
            lanes.apply(group.offload(f).without_spin()).into_future(),
            i,
        );
        errors.push(None);
    }
    while let Some((i, outcome)) = poll_fn(|cx| set.poll_next(cx)).await {
        match outcome {
            Ok(Ok(value)) => {
                // Cancels the queued losers and stops the running ones
                // before their futures go (which then find them finished
                // or leave them to their stop token).
                group.stop();
                set.clear();
                return Ok((i, value));
            }
            Ok(Err(e)) => errors[i] = Some(BatchError::Failed(e)),
            Err(e) => errors[i] = Some(BatchError::Job(e)),
        }
    }
    Err(AllFailed {
        errors: errors.into_iter().flatten().collect(),
    })
}

/// A batch of functions on their way into a pool, from
/// [`Offloader::invoke_all`] or [`JobGroup::invoke_all`]: await it for every
/// outcome, in input order.
#[must_use = "a batch does nothing until it is awaited"]
pub struct InvokeAll<F> {
    target: Target,
    fs: Vec<F>,
    timeout: Option<Duration>,
    policy: Option<AbandonPolicy>,
    lanes: BatchLanes,
}

/// `key` and `limiter` of a builder of many jobs (`InvokeAll`, `InvokeAny`,
/// `Map`), with a `lanes: BatchLanes` field; `$what` names the jobs' whole
/// in the docs.
macro_rules! lane_methods {
    ($what:literal) => {
        #[doc = concat!("Every job of the ", $what, " in `key`'s lane")]
        /// ([`Offload::key`](crate::Offload::key)).
        pub fn key(mut self, key: impl Into<crate::job::lane::LaneKey>) -> Self {
            self.lanes.key(key);
            self
        }

        #[doc = concat!("Every job of the ", $what, " needs a permit of `limiter`")]
        /// ([`Offload::limiter`](crate::Offload::limiter)); several allowed.
        pub fn limiter(mut self, limiter: &crate::job::limiter::Limiter) -> Self {
            self.lanes.limiter(limiter);
            self
        }
    };
}
pub(crate) use lane_methods;

/// The key and limiters every job of a batch gets.
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchLanes {
    key: Option<crate::job::lane::LaneKey>,
    limiters: Vec<crate::job::limiter::Limiter>,
}

impl BatchLanes {
    pub(crate) fn key(&mut self, key: impl Into<crate::job::lane::LaneKey>) {
        self.key = Some(key.into());
    }

    pub(crate) fn limiter(&mut self, limiter: &crate::job::limiter::Limiter) {
        self.limiters.push(limiter.clone());
    }

    /// Gives `offload` the batch's key and limiters.
    pub(crate) fn apply<F, T>(
        &self,
        mut offload: crate::api::offload::Offload<F, T>,
    ) -> crate::api::offload::Offload<F, T>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        if let Some(key) = &self.key {
            offload = offload.key(key.clone());
        }
        for l in &self.limiters {
            offload = offload.limiter(l);
        }
        offload
    }
}

impl<F> InvokeAll<F> {
    fn new(target: Target, fs: impl IntoIterator<Item = F>) -> Self {
        InvokeAll {
            target,
            fs: fs.into_iter().collect(),
            timeout: None,
            policy: None,
            lanes: BatchLanes::default(),
        }
    }

    lane_methods!("batch");

    /// Stops waiting after `limit` (from the batch's first poll):
    /// jobs still unfinished then follow their abandon policy, and their
    /// outcome is [`Error::TimedOut`], which says whether each was
    /// cancelled, stopped or kept running.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// The abandon policy of every job of the batch (default: the pool's).
    ///
    /// When the batch times out or is dropped, it applies the policy to its
    /// queued jobs first, then to its running ones: a running job stopped first
    /// could give its permit to a queued job about to be cancelled.
    pub fn on_abandon(mut self, policy: AbandonPolicy) -> Self {
        self.policy = Some(policy);
        self
    }
}

impl<F, T> IntoFuture for InvokeAll<F>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    type Output = Vec<Result<T, Error>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Vec<Result<T, Error>>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        let InvokeAll {
            target,
            fs,
            timeout,
            policy,
            lanes,
        } = self;
        // Built at the first poll: the timeout runs from there.
        Box::pin(async move {
            let began = Began::now();
            // What each function sees as its stop token's deadline, as a
            // single offload's `with_timeout` gives it.
            let deadline = timeout.and_then(|limit| began.real()?.checked_add(limit));
            let mut batch = Leaving(ReadySet::new());
            let mut outcomes = Vec::with_capacity(fs.len());
            for (i, f) in fs.into_iter().enumerate() {
                let mut offload = lanes.apply(target.offload(f).without_spin());
                if let Some(at) = deadline {
                    offload = offload.deadline(at);
                }
                if let Some(policy) = policy {
                    offload = offload.on_abandon(policy);
                }
                batch.0.push(offload.into_future(), i);
                outcomes.push(None);
            }
            // The batch's own timer, not one per job: when it fires, every
            // job left follows its policy, the queued ones first.
            let mut timer = timeout
                .map(|limit| Box::pin(tokio::time::sleep_until(began.timer_deadline(limit))));
            let timed_out = loop {
                let next = poll_fn(|cx| match batch.0.poll_next(cx) {
                    Poll::Ready(next) => Poll::Ready(Some(next)),
                    Poll::Pending => match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                        Some(Poll::Ready(())) => Poll::Ready(None),
                        _ => Poll::Pending,
                    },
                })
                .await;
                match next {
                    Some(Some((i, outcome))) => outcomes[i] = Some(outcome),
                    Some(None) => break false,
                    None => break true,
                }
            };
            if timed_out {
                let waited = began.waited();
                for queued_only in [true, false] {
                    batch.0.for_each_live(|i, fut| {
                        if let Some(out) = fut.leave(Departure::TimedOut, waited, queued_only) {
                            outcomes[i] = Some(out);
                        }
                    });
                }
            }
            outcomes.into_iter().flatten().collect()
        })
    }
}

/// The jobs of an `invoke_all` in flight. If the batch is dropped before
/// they finish, the queued ones are let go first (their policy applied),
/// then the others, as their futures drop: a running job stopped first
/// would give its permit to a queued one about to be cancelled.
struct Leaving<F, T>(ReadySet<OffloadFuture<F, T>>)
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static;

impl<F, T> Drop for Leaving<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn drop(&mut self) {
        self.0.for_each_live(|_, fut| {
            fut.leave(Departure::Dropped, Duration::ZERO, true);
        });
    }
}

impl<F> fmt::Debug for InvokeAll<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InvokeAll")
            .field("jobs", &self.fs.len())
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}
