//! Compile-time checks that the public types can cross threads and tasks.
//! A regression here fails the build of this test.

use std::future::{Future, IntoFuture};

use offloader::{
    AbandonPolicy, AllFailed, BuildError, Builder, Error, Fate, JobHandle, JobId, JobState,
    Metrics, Offload, OffloadFuture, Offloader, StopCallback, StopToken, Stopped, SubmitError,
};

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn send_sync<T: Send + Sync>() {}
fn static_error<T: std::error::Error + Send + Sync + 'static>() {}
fn unpin<T: Unpin>() {}

type Func = fn(&StopToken) -> u32;

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Offloader>();
    send_sync::<Builder>();
    send_sync::<StopToken>();
    send_sync::<StopCallback>();
    send_sync::<Error>();
    send_sync::<BuildError>();
    send_sync::<Stopped>();
    send_sync::<Metrics>();
    send_sync::<JobId>();
    send_sync::<JobState>();
    send_sync::<Fate>();
    send_sync::<AbandonPolicy>();

    // JobHandle<T> for a Send T: movable to another task or thread, and
    // shareable (cancel/stop/state take &self).
    send::<JobHandle<u32>>();
    send::<JobHandle<String>>();
    send::<JobHandle<Vec<u8>>>();
    sync::<JobHandle<u32>>();
    unpin::<JobHandle<u32>>();

    // The builder and the future of a Send function and result.
    send::<Offload<Func, u32>>();
    send::<OffloadFuture<Func, u32>>();
    send::<SubmitError<Func>>();

    static_error::<Error>();
    static_error::<BuildError>();
    static_error::<Stopped>();
    static_error::<SubmitError<Func>>();
    // `invoke_any`'s failure, for an error type that is one, and for the
    // `String` a quick closure returns.
    static_error::<AllFailed<std::io::Error>>();
    static_error::<AllFailed<String>>();
    // `map`'s streams, whatever their iterator and item.
    type Pinned = std::marker::PhantomPinned;
    type PinnedMap = offloader::Map<
        std::vec::IntoIter<Pinned>,
        fn(Pinned, &StopToken) -> Result<Pinned, Pinned>,
        Pinned,
        Pinned,
    >;
    send::<PinnedMap>();
    unpin::<PinnedMap>();
    unpin::<
        offloader::Indexed<
            std::vec::IntoIter<Pinned>,
            fn(Pinned, &StopToken) -> Result<Pinned, Pinned>,
            Pinned,
            Pinned,
        >,
    >();
}

/// The concrete closure types users write are accepted too, and the futures
/// can be handed to `tokio::spawn` (which requires `Send + 'static`).
#[test]
fn futures_of_real_closures_can_be_spawned_on_tokio() {
    fn spawnable<F: Future + Send + 'static>(_: &F)
    where
        F::Output: Send + 'static,
    {
    }
    fn send_val<T: Send>(_: &T) {}

    let pool = Offloader::builder().build().expect("valid");
    let owned = String::from("moved in");
    let offload = pool.offload(move |stop| {
        let _ = stop.is_stopped();
        owned.len()
    });
    send_val(&offload);
    let fut = offload.into_future();
    spawnable(&fut);
    drop(fut);

    let handle = pool.offload(|_stop| vec![1u8]).spawn().expect("accepted");
    spawnable(&handle);
    drop(handle);

    let free = offloader::offload(|_stop| 1u8).into_future();
    spawnable(&free);
    drop(free);

    // Batch calls: movable before they are awaited, spawnable after.
    let calls = [|_: &offloader::StopToken| Ok::<u8, String>(1)];
    let race = pool.invoke_any(calls).key("k");
    send_val(&race);
    let race = race.into_future();
    spawnable(&race);
    drop(race);
    let all = pool.invoke_all([|_: &offloader::StopToken| 1u8]);
    send_val(&all);
    let all = all.into_future();
    spawnable(&all);
    drop(all);
}
