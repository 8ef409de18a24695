//! What a user calls: a prepared call ([`offload::Offload`]) and its
//! future, the owner handle, job groups, batch calls and `map`, and the
//! optional interop with tokio-util and `metrics`. Built on `core/`.

pub(crate) mod awaited;
pub(crate) mod batch;
#[cfg(feature = "metrics")]
pub(crate) mod export;
pub(crate) mod group;
pub(crate) mod handle;
#[cfg(feature = "tokio-util")]
pub(crate) mod interop;
pub(crate) mod map;
pub(crate) mod offload;
