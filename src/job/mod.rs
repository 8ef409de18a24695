//! What a job is, in the words a user meets: its id and state, its key,
//! the policies that apply to it, its stop token, the errors it can end
//! in, the limiters it takes, and its shared record ([`record::JobCore`])
//! and cell ([`cell::Job`]: the function and the slot its outcome goes
//! to). Nothing here names the pool.

pub(crate) mod cell;
pub(crate) mod error;
pub(crate) mod id;
pub(crate) mod lane;
pub(crate) mod limiter;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod stop;
