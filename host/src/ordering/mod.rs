//! Cross-stream ordering that cannot deadlock (issue 5; rules in `docs/safety.md`).
//!
//! - [`Fence`]: the caller's later work waits for internal work submitted later
//!   (stream-wait-value fence seed), refused unless every kernel is loaded.
//! - [`Signal`]: a u32/u64 flag in device memory with on-stream wait/set/add (stream memory
//!   operations; NVSHMEM's on-stream signal operations) and device-side acquire/release access.
//! - [`TaskGraph`]: tasks on lanes with dependencies, checked for cycles and unsatisfiable waits
//!   including the edges CUDA cannot see, enqueued producer-first, or captured as a CUDA graph.
//! - [`MultiTaskGraph`]: a task graph over streams of several GPUs with signals on a home GPU,
//!   checked for cycles across GPUs before anything is enqueued (issue 13).
//! - [`synchronize_timeout`]: a bounded wait that reports pending signal waits as
//!   [`crate::Error::Timeout`].
//!
//! Module graph (no cycles; host/tests/layers.rs checks it): `types` (shared leaf types) <-
//! `registry` (pending stream waits), `check` (pure-CPU planning) <- `signal` <- `graph` <-
//! `watch`, `multi`; `fence` uses `registry` and `types`. Every registered wait is also handed to
//! the crate's reaper (below `stream`), whose gate asks it; `MultiTaskGraph::enqueue` (which
//! takes a `multi::DeviceSet`) is defined in `multi`, the layer above.

mod check;
mod fence;
mod graph;
mod multi;
mod registry;
mod signal;
mod types;
mod watch;

pub use check::{Edge, EdgeKind, Plan, TaskId};
pub use fence::{Fence, FenceTicket};
pub use graph::{CapturedGraph, GraphRun, Lane, SignalRef, TaskContext, TaskGraph};
pub use multi::MultiTaskGraph;
pub use signal::{Signal, SignalWord};
pub use types::Cmp;
pub use watch::{synchronize_timeout, OnTimeout, Watched};

#[allow(unused_imports)] // API for the fence (finding 7): waits the watchdog must not release.
pub(crate) use registry::register_stream_wait;
#[allow(unused_imports)]
pub(crate) use types::{Releasable, Release};
