//! `map(items, f)`: a bounded fan-out over an iterator, as a stream of
//! outcomes, in input or completion order, with an error policy.

use std::collections::VecDeque;
use std::fmt;
use std::future::IntoFuture;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::api::awaited::OffloadFuture;
use crate::api::batch::{BatchError, Target};
use crate::api::group::JobGroup;
use crate::core::pool::Offloader;
use crate::job::error::Error;
use crate::job::policy::GroupDropPolicy;
use crate::job::stop::StopToken;
use crate::util::ready::ReadySet;
use crate::util::sync::Arc;

/// One item's call, boxed so that the stream can name its futures.
type Call<T, E> = Box<dyn FnOnce(&StopToken) -> Result<T, E> + Send>;

impl Offloader {
    /// Runs `f` on this pool for each item of `items`, a bounded number at
    /// once, as a [`Stream`] of outcomes.
    ///
    /// At most [`limit`](Map::limit) run at once (default: the pool's
    /// `max_in_flight`); outcomes come in input order (default) or in
    /// completion order ([`unordered`](Map::unordered)).
    ///
    /// Items are taken from the iterator only as room frees, so memory follows
    /// the limit, not the input. Like Python's `Executor.map`, bounded. Once
    /// the pool shuts down or the group is stopped, no more items are taken:
    /// each item already taken but not yet accepted (up to the limit) yields
    /// its refusal, and the stream ends after the jobs in flight.
    ///
    /// The jobs run in a group of their own: dropping the stream stops
    /// those still in flight (queued ones are cancelled, running ones get
    /// their stop token set and keep their permits until they return).
    ///
    /// With [`futures_util::StreamExt`][StreamExt] (or
    /// [`tokio_stream::StreamExt`][tokio-stream]: both work on any
    /// [`Stream`]), `next().await` reads it one outcome at a time, and
    /// `collect` gathers them:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use futures_util::StreamExt;
    ///
    /// let pool = offloader::Offloader::builder().build()?;
    /// let mut lengths = pool
    /// .map(["a", "bb", "ccc"], |s, _stop| Ok::<_, std::io::Error>(s.len()))
    /// .limit(2);
    /// while let Some(len) = lengths.next().await {
    /// println!("{}", len?);
    /// }
    ///
    /// let sizes: Result<Vec<usize>, _> = pool
    /// .map(["a", "bb", "ccc"], |s, _stop| Ok::<_, std::io::Error>(s.len()))
    /// .collect::<Vec<_>>()
    /// .await
    /// .into_iter()
    /// .collect();
    /// assert_eq!(sizes?, [1, 2, 3]);
    /// # Ok(()) }
    /// ```
    ///
    /// `f` takes the item and the job's [`StopToken`] (set when the stream
    /// is dropped or [`stop_on_error`](Map::stop_on_error) stops the rest)
    /// and returns a `Result`: its `Err` is the item's
    /// [`BatchError::Failed`], which `stop_on_error` stops on. A function
    /// that cannot fail says so with `Ok::<_, std::convert::Infallible>(v)`.
    /// [`indexed`](Map::indexed) pairs each outcome with its item's index.
    ///
    /// [StreamExt]: https://docs.rs/futures-util/0.3/futures_util/stream/trait.StreamExt.html
    /// [tokio-stream]: https://docs.rs/tokio-stream/0.1/tokio_stream/trait.StreamExt.html
    pub fn map<I, F, T, E>(&self, items: I, f: F) -> Map<I::IntoIter, F, T, E>
    where
        I: IntoIterator,
        I::Item: Send + 'static,
        F: Fn(I::Item, &StopToken) -> Result<T, E> + Send + Sync + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        Map::new(Target::Pool(self.clone()), items.into_iter(), f)
    }
}

impl JobGroup {
    /// [`Offloader::map`] with every job in a new child of this group.
    pub fn map<I, F, T, E>(&self, items: I, f: F) -> Map<I::IntoIter, F, T, E>
    where
        I: IntoIterator,
        I::Item: Send + 'static,
        F: Fn(I::Item, &StopToken) -> Result<T, E> + Send + Sync + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        Map::new(Target::Group(self.clone()), items.into_iter(), f)
    }
}

/// The stream of [`Offloader::map`] and [`JobGroup::map`]: yields
/// `Result<T, BatchError<E>>` per item ([`indexed`](Map::indexed): with the
/// item's index).
///
/// It is [`Unpin`] whatever its iterator, items and outcomes: it never
/// pins them, so `StreamExt::next` works on it as it is, without `pin!` or
/// `Box::pin`.
#[must_use = "streams do nothing unless polled"]
pub struct Map<It, F, T, E> {
    target: Target,
    items: It,
    f: Arc<F>,
    limit: usize,
    ordered: bool,
    stop_on_error: bool,
    /// The jobs' group, made at the first poll.
    group: Option<JobGroup>,
    set: ReadySet<OffloadFuture<Call<T, E>, Result<T, E>>>,
    /// Items taken from the iterator so far.
    taken: usize,
    /// In input order: outcomes from index `yielded` on, `None` while the
    /// job runs (at most `limit` entries).
    window: VecDeque<Option<Result<T, BatchError<E>>>>,
    /// Items yielded (input order only).
    yielded: usize,
    /// No more items are taken: the iterator ended, or an error stopped the
    /// map.
    closed: bool,
    /// The error that stopped the map and its item's index, yielded after
    /// the outcomes before it.
    failed: Option<(usize, BatchError<E>)>,
    lanes: crate::api::batch::BatchLanes,
}

impl<It, F, T, E> Map<It, F, T, E> {
    fn new(target: Target, items: It, f: F) -> Self {
        let limit = match &target {
            Target::Pool(p) => p.inner().config.max_in_flight,
            Target::Group(g) => g.pool.inner().config.max_in_flight,
        };
        Map {
            target,
            items,
            f: Arc::new(f),
            limit,
            ordered: true,
            stop_on_error: false,
            group: None,
            set: ReadySet::new(),
            taken: 0,
            window: VecDeque::new(),
            yielded: 0,
            closed: false,
            failed: None,
            lanes: crate::api::batch::BatchLanes::default(),
        }
    }

    crate::api::batch::lane_methods!("map");

    /// At most `k` jobs in flight (at least 1).
    ///
    /// In input order, at most `k` outcomes wait to be yielded too. Items are
    /// taken `k` at a time as room frees: with an endless iterator, keep `k`
    /// finite and small.
    pub fn limit(mut self, k: usize) -> Self {
        self.limit = k.max(1);
        self
    }

    /// Yields outcomes as jobs finish, not in input order.
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// On the first error (a function's `Err`, a panic, ...), stops the rest.
    ///
    /// Queued jobs are cancelled, running ones get their stop token set, no
    /// more items are taken; the stream yields the outcomes before the error
    /// (in input order: those before it with no gap), then the error, then
    /// ends.
    ///
    /// Default: go on and yield every outcome.
    pub fn stop_on_error(mut self) -> Self {
        self.stop_on_error = true;
        self
    }

    /// Yields each outcome with the index of its item in the input, `(usize,
    /// Result<T, BatchError<E>>)`, in either order.
    ///
    /// Call it last: the other settings are made on the `Map`.
    ///
    /// In completion order it is the way to tell which item an outcome is
    /// for, and with [`stop_on_error`](Map::stop_on_error) in input order it
    /// names the item that failed (not the next index: an item after
    /// others still in flight can fail first).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use futures_util::StreamExt;
    ///
    /// let pool = offloader::Offloader::builder().build()?;
    /// let names = ["a.txt", "missing.txt", "b.txt"];
    /// let mut reads = pool
    ///     .map(names, |name, _stop| {
    ///         if name == "missing.txt" { Err("no such file") } else { Ok(name.len()) }
    ///     })
    ///     .unordered()
    ///     .indexed();
    /// let mut failed = Vec::new();
    /// while let Some((i, outcome)) = reads.next().await {
    ///     if let Err(e) = outcome {
    ///         failed.push(format!("{}: {e}", names[i]));
    ///     }
    /// }
    /// assert_eq!(failed, ["missing.txt: the function failed: no such file"]);
    /// # Ok(()) }
    /// ```
    pub fn indexed(self) -> Indexed<It, F, T, E> {
        Indexed(self)
    }
}

impl<It, F, T, E> Map<It, F, T, E>
where
    It: Iterator,
    It::Item: Send + 'static,
    F: Fn(It::Item, &StopToken) -> Result<T, E> + Send + Sync + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    /// Takes items while there is room.
    fn fill(&mut self) {
        let group = self
            .group
            .get_or_insert_with(|| self.target.group().on_drop(GroupDropPolicy::Stop));
        while !self.closed && self.set.live() < self.limit && self.window.len() < self.limit {
            let Some(item) = self.items.next() else {
                self.closed = true;
                break;
            };
            let f = self.f.clone();
            let call: Call<T, E> = Box::new(move |stop| f(item, stop));
            let offload = self.lanes.apply(group.offload(call).without_spin());
            self.set.push(offload.into_future(), self.taken);
            self.taken += 1;
            if self.ordered {
                self.window.push_back(None);
            }
        }
    }

    /// The error policy's stop: cancels or stops every job in flight and
    /// takes no more items; `error` is yielded after the outcomes before it.
    fn stop(&mut self, i: usize, error: BatchError<E>) {
        self.closed = true;
        if let Some(group) = &self.group {
            group.stop();
        }
        self.set.clear();
        self.failed = Some((i, error));
        // In input order, only the outcomes before the first gap are still
        // yielded.
        if let Some(gap) = self.window.iter().position(Option::is_none) {
            self.window.truncate(gap);
        }
    }

    /// The next outcome and its item's index.
    fn poll_indexed(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, Outcome<T, E>)>> {
        loop {
            if self.ordered && matches!(self.window.front(), Some(Some(_))) {
                let i = self.yielded;
                self.yielded += 1;
                return Poll::Ready(self.window.pop_front().flatten().map(|o| (i, o)));
            }
            if let Some((i, error)) = self.failed.take() {
                self.window.clear();
                return Poll::Ready(Some((i, Err(error))));
            }
            self.fill();
            let (i, outcome) = match self.set.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(done)) => done,
            };
            let outcome = match outcome {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(e)) => Err(BatchError::Failed(e)),
                Err(e) => Err(BatchError::Job(e)),
            };
            if let Err(BatchError::Job(
                Error::ShuttingDown { id: None } | Error::Cancelled { id: None },
            )) = &outcome
            {
                // No later item could be accepted either: take no more.
                self.closed = true;
            }
            let outcome = match outcome {
                Err(error) if self.stop_on_error => {
                    self.stop(i, error);
                    continue;
                }
                outcome => outcome,
            };
            if !self.ordered {
                return Poll::Ready(Some((i, outcome)));
            }
            if let Some(slot) = self.window.get_mut(i - self.yielded) {
                *slot = Some(outcome);
            }
        }
    }
}

/// One item's outcome.
type Outcome<T, E> = Result<T, BatchError<E>>;

// Nothing is pinned in place: `poll_next` takes `&mut Map` out of the pin
// and never pins a field again (the jobs' futures are boxed by `ReadySet`),
// so a `!Unpin` iterator, item or outcome does not make the stream
// `!Unpin`.
impl<It, F, T, E> Unpin for Map<It, F, T, E> {}

impl<It, F, T, E> Stream for Map<It, F, T, E>
where
    It: Iterator,
    It::Item: Send + 'static,
    F: Fn(It::Item, &StopToken) -> Result<T, E> + Send + Sync + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    type Item = Result<T, BatchError<E>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut()
            .poll_indexed(cx)
            .map(|next| next.map(|(_, outcome)| outcome))
    }
}

/// A [`Map`] whose outcomes come with their item's index, from
/// [`Map::indexed`]: yields `(usize, Result<T, BatchError<E>>)`.
#[must_use = "streams do nothing unless polled"]
pub struct Indexed<It, F, T, E>(Map<It, F, T, E>);

impl<It, F, T, E> Stream for Indexed<It, F, T, E>
where
    It: Iterator,
    It::Item: Send + 'static,
    F: Fn(It::Item, &StopToken) -> Result<T, E> + Send + Sync + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    type Item = (usize, Result<T, BatchError<E>>);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().0.poll_indexed(cx)
    }
}

impl<It, F, T, E> fmt::Debug for Indexed<It, F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Indexed").field(&self.0).finish()
    }
}

impl<It, F, T, E> fmt::Debug for Map<It, F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("limit", &self.limit)
            .field("ordered", &self.ordered)
            .field("stop_on_error", &self.stop_on_error)
            .field("taken", &self.taken)
            .field("in_flight", &self.set.live())
            .finish_non_exhaustive()
    }
}
