//! Frees that may block run off the caller's thread, on warpline's reaper thread: the free of a
//! [`crate::PinnedBuffer`], a module unload, the destroy of a stream dropped inside a host
//! callback, each run only when no registered on-stream wait is pending (the gate).
//!
//! The thread and its gate live in a crate-internal module below `stream` (streams hand their
//! destroys to it, and stream creation passes its gate), so that no lower layer imports `memory`;
//! this module keeps the public entry point, [`flush`].

pub use crate::reaper::flush;
