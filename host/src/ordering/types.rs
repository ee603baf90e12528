//! Leaf module of `ordering`: the types every other part shares ([`Cmp`], [`Release`],
//! [`Releasable`], [`PendingOp`]). It imports nothing from its siblings, so the modules form a
//! DAG: `types` <- `registry`, `check` <- `signal` <- `graph` <- `watch`.

use std::ffi::c_uint;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::error::Result;
use crate::stream::Stream;

/// The condition of an on-stream wait (`CUstreamWaitValue_flags`): the stream continues once the
/// signal's value `s` satisfies it against the operand `v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `s == v` (`CU_STREAM_WAIT_VALUE_EQ`).
    Eq,
    /// `s >= v` as the driver compares (`CU_STREAM_WAIT_VALUE_GEQ`): cyclically, `(s - v)`
    /// (wrapping) read as a signed integer of the word's width is `>= 0`. For a 64-bit word that
    /// is `s` in `[v, v + 2^63)` modulo 2^64, so a value 2^63 or more past `v` (after wrapping
    /// adds, say) does *not* satisfy it ([`Cmp::holds`]).
    Geq,
    /// `(s & v) != 0` (`CU_STREAM_WAIT_VALUE_AND`).
    And,
    /// `!(s | v) != 0` (`CU_STREAM_WAIT_VALUE_NOR`).
    Nor,
}

impl Cmp {
    /// Whether the 64-bit word value `s` satisfies the condition against operand `v` (the
    /// driver's rule for `cuStreamWaitValue64`, the width of [`super::TaskGraph`]'s signals):
    /// `Geq` is the cyclic `(s.wrapping_sub(v) as i64) >= 0`, not `s >= v`; e.g. `s = u64::MAX`
    /// does not satisfy `>= 1`, and `s = 2^63` does not satisfy `>= 0`.
    pub fn holds(self, s: u64, v: u64) -> bool {
        match self {
            Cmp::Eq => s == v,
            Cmp::Geq => s.wrapping_sub(v) as i64 >= 0,
            Cmp::And => s & v != 0,
            Cmp::Nor => !(s | v) != 0,
        }
    }

    /// A value that satisfies the condition against `v`, if one exists (used to release a wait
    /// that timed out).
    pub fn satisfying_value(self, v: u64) -> Option<u64> {
        match self {
            Cmp::Eq | Cmp::Geq => Some(v),
            Cmp::And => (v != 0).then_some(v),
            Cmp::Nor => (v != u64::MAX).then_some(0),
        }
    }

    pub(crate) fn flags(self) -> c_uint {
        use sys::CUstreamWaitValue_flags as F;
        (match self {
            Cmp::Eq => F::CU_STREAM_WAIT_VALUE_EQ,
            Cmp::Geq => F::CU_STREAM_WAIT_VALUE_GEQ,
            Cmp::And => F::CU_STREAM_WAIT_VALUE_AND,
            Cmp::Nor => F::CU_STREAM_WAIT_VALUE_NOR,
        }) as c_uint
    }
}

impl std::fmt::Display for Cmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cmp::Eq => "==",
            Cmp::Geq => ">=",
            Cmp::And => "& !=0",
            Cmp::Nor => "nor !=0",
        })
    }
}

/// A signal that a timed-out wait can be released on (object-safe view for the watchdog).
pub(crate) trait Releasable: Send + Sync {
    /// Enqueues a write of `value` on `stream` (which becomes one of the signal's users).
    fn write_on(&self, stream: &Stream, value: u64) -> Result<()>;
    /// The context whose streams may write it.
    fn context(&self) -> &Arc<CudaContext>;
    /// Stores `value` from the host when the word is host memory the CPU may write (a fence
    /// slot), which needs no hardware queue; returns false when a stream write is needed.
    fn store_from_host(&self, _value: u64) -> bool {
        false
    }
}

/// How [`crate::ordering::OnTimeout::Release`] may release a pending wait: write a value that
/// satisfies `cmp` against `value` to `signal`.
#[derive(Clone)]
pub(crate) struct Release {
    pub signal: Arc<dyn Releasable>,
    pub cmp: Cmp,
    pub value: u64,
}

/// An operation that had not completed when a bound passed. `release: None`: the watchdog must
/// not touch it (plain work, or a wait whose memory others share, such as a fence's flag).
pub(crate) struct PendingOp {
    pub what: String,
    pub release: Option<Release>,
}
