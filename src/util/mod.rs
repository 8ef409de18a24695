//! Building blocks that know nothing of jobs: time and the paused test
//! clock, running foreign code quietly, lists, wait lists and the std/loom
//! switch. Nothing here names a module above it.

pub(crate) mod clock;
pub(crate) mod quiet;
pub(crate) mod ready;
pub(crate) mod slab;
pub(crate) mod sync;
pub(crate) mod wait_list;
